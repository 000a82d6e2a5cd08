import sys

from fleet.cli.main import main

sys.exit(main())
