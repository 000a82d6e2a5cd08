#!/usr/bin/env bash
# Copy cloudpickle from fleet's own environment into .build/cloudpickle, for the images to COPY: a
# function's call (fleet.function) is read by the same cloudpickle that pickled it, and fleet's
# environment is where callers get theirs. Pure Python, so no index and no pip in the image.
# Run from the repository root (make images; images/torch/build.sh).
set -euo pipefail
source=$("${PYTHON:-python3}" -c 'import cloudpickle, os; print(os.path.dirname(cloudpickle.__file__))')
rm -rf .build/cloudpickle && mkdir -p .build && cp -r "$source" .build/cloudpickle
rm -rf .build/cloudpickle/__pycache__
