import sys

from fleet.cli.main import run

sys.exit(run())
