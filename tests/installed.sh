#!/usr/bin/env bash
# fleet as users install it: build the sdist, and the wheel from that sdist, out of this checkout;
# install the wheel (not editable) into a fresh venv of the system's Python; run the smoke, workdir
# and Redis-install tests there from a copy of tests/, so nothing of the checkout is on sys.path.
# Usage: bash tests/installed.sh [PYTHON]   (default /usr/bin/python3, Debian's; `make test` runs it)
set -euo pipefail
python=${1:-/usr/bin/python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
builder="$repo/.venv/bin/python"  # has `build` (make install)
work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-installed.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # jobs run as an unprivileged user: they must reach the venv's interpreter

echo "installed: building the sdist and the wheel from it"
"$builder" -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/fleet-*.whl)
"$python" -m venv "$work/venv"
echo "installed: installing $(basename "$wheel") into a venv of $("$python" --version)"
"$work/venv/bin/python" -m pip install -q "$wheel[dev,torch]" 2>&1 | grep -v "is ignored" || true
"$work/venv/bin/python" -m pip check

# the tests, the harness they start services with (bench/procs.py) and the files they read from a
# checkout (the README's example); no fleet/, no workers/fleet_worker
mkdir -p "$work/suite/workers" "$work/suite/bench"
cp -r "$repo/tests" "$repo/pyproject.toml" "$work/suite/"
cp "$repo/bench/__init__.py" "$repo/bench/procs.py" "$work/suite/bench/"
cp -r "$repo/workers/examples" "$work/suite/workers/"
cd "$work/suite"
"$work/venv/bin/python" - "$repo" <<'EOF'
import sys
from pathlib import Path

import fleet
import fleet_worker

checkout = Path(sys.argv[1]).resolve()
for module in (fleet, fleet_worker):
    where = Path(module.__file__).resolve()
    assert checkout not in where.parents, f"{module.__name__} imported from the checkout: {where}"
print("installed: fleet from", Path(fleet.__file__).parent)
EOF
PATH="$work/venv/bin:$PATH" "$work/venv/bin/fleet" --help >/dev/null
PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" -m pytest -p no:cacheprovider -q \
  tests/integration/test_workdir.py tests/integration/test_fleet.py tests/integration/test_up.py \
  tests/integration/test_redis_install.py tests/unit/test_ops.py
