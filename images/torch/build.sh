#!/usr/bin/env bash
# Build localhost/fleet/torch without a registry: wheels from the package index on the host, then an
# offline install into the image. Run from the repository root (make images).
set -euo pipefail
mkdir -p .build/wheels
# pip from the venv make made (a system python3 may have no pip)
"${PYTHON:-python3}" -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .build/wheels torch==2.13.0 numpy
PYTHON="${PYTHON:-python3}" bash images/cloudpickle.sh  # what runs a fleet.function's call
docker build -q -t localhost/fleet/torch:latest -f images/torch/Dockerfile . >/dev/null
echo "built localhost/fleet/torch"
