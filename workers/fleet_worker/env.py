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
    """GPUs given to this member (0 on a CPU-only member)."""
    return int(os.environ.get("FLEET_NUM_GPUS", "0"))
