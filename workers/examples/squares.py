"""A function on the fleet: ``python3 squares.py`` with FLEET_API_URL and FLEET_TOKEN set (the line
``fleet up`` prints), from this directory, which ships with each call (``workdir="."``)."""

import os

import fleet


@fleet.function(gpus=1, workdir=".")
def squares(n):
    return sum(i * i for i in range(n)), os.environ.get("CUDA_VISIBLE_DEVICES")


if __name__ == "__main__":
    print(squares(10))  # here, as always: (285, None)
    call = squares.submit(1000)  # on the fleet: a job, on a GPU of its own
    print(call.job_id, call.result(timeout=600))  # (332833500, 'GPU-...')
