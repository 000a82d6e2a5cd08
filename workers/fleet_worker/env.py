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


def batch_size(default: int | None = None, *, follow: bool = False) -> int | None:
    """The job's global batch size (``FLEET_BATCH_SIZE``), over all its GPUs and members; ``default``
    when fleet set none (a job without ``batch_size``, or outside fleet). An elastic job's may change
    from one attempt to the next: read it at every start, and rescale the learning rate (``scale_lr``).

    ``follow=True``: the batch fleet wants now, which for an elastic job may change while it runs on
    the same GPUs (read again from ``FLEET_CONTROL_DIR``, a file read, at each call), and a promise:
    the job takes a new batch up as it goes (call it every few steps, in one process of a
    distributed job: ``fw.dist.batch_agreed``), so its reports say it follows, and fleet changes its
    batch alone without restarting it. A job that only reads its batch at start does not pass it:
    fleet restarts it for such a change, as for any other."""
    global _followed
    if follow:
        found = _control_batch()
        if found is not None or _followed is None:
            _followed = found if found is not None else batch_size(default)
        return _followed
    value = os.environ.get("FLEET_BATCH_SIZE")
    return int(value) if value else default


#: the batch ``batch_size(follow=True)`` last gave (None: never called: the job does not follow)
_followed: int | None = None


def followed_batch() -> int | None:
    """The batch ``batch_size(follow=True)`` last gave this process; None if it never was asked, or
    where fleet cannot change it in place (no ``FLEET_CONTROL_DIR``: not an elastic job of fleet's)."""
    return _followed if os.environ.get("FLEET_CONTROL_DIR") else None


def _control_batch() -> int | None:
    folder = os.environ.get("FLEET_CONTROL_DIR")
    if not folder:
        return None
    try:
        with open(os.path.join(folder, "batch_size")) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value > 0 else None
