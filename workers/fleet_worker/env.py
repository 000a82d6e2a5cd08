"""What fleet tells every attempt through its environment."""

from __future__ import annotations

import os


def job_id() -> str:
    return os.environ.get("FLEET_JOB_ID", "local")


def attempt() -> int:
    return int(os.environ.get("FLEET_ATTEMPT", "1"))


def num_nodes() -> int:
    """Members in the job's gang (one per node); 1 for a single-node job or outside fleet."""
    return int(os.environ.get("FLEET_NUM_NODES", "1"))


def node_rank() -> int:
    """This member's place in the gang, 0 .. num_nodes() - 1."""
    return int(os.environ.get("FLEET_NODE_RANK", "0"))


def num_gpus() -> int:
    """GPUs given to this member (0 on a CPU-only member). An elastic job's change from one attempt to
    the next: start this many workers (processes) per member."""
    return int(os.environ.get("FLEET_NUM_GPUS", "0"))


def batch_size(default: int | None = None) -> int | None:
    """The job's global batch size (``FLEET_BATCH_SIZE``), over all its GPUs and members; ``default``
    when fleet set none (a job without ``batch_size``, or outside fleet). An elastic job's may change
    from one attempt to the next: read it at every start, and rescale the learning rate (``scale_lr``)."""
    value = os.environ.get("FLEET_BATCH_SIZE")
    return int(value) if value else default
