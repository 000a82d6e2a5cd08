"""Elastic jobs: what changes when fleet resizes one, and the rule to follow.

fleet may restart an elastic job (``gpus: {min, max}``) at another GPU count and global batch size:
SIGTERM, the job checkpoints and exits, and the next attempt gets ``FLEET_NUM_GPUS`` (workers per
member) and ``FLEET_BATCH_SIZE`` (the global batch) for its new size. The job reads both at every
start, resumes from its checkpoint (steps, model and optimizer state carry over at any size), and
rescales its learning rate with the batch::

    batch = fw.batch_size(256)
    lr = fw.scale_lr(0.1, base_batch=256, batch=batch)      # linear scaling: 0.2 at batch 512

The linear scaling rule (Goyal et al., "Accurate, Large Minibatch SGD", 2017): multiply the learning
rate by the factor the batch grew by. It holds for SGD within the range of batch sizes a model is
known to train well at (which is what an elastic job's ``batch_size: {min, max}`` declares); for Adam
the square-root rule (``rule="sqrt"``) is the usual choice.
"""

from __future__ import annotations

import math

RULES = ("linear", "sqrt")


def scale_lr(base_lr: float, base_batch: int, batch: int, rule: str = "linear") -> float:
    """The learning rate for global batch ``batch``, given ``base_lr`` tuned at ``base_batch``:
    ``base_lr * batch / base_batch`` (linear), or its square root's factor (``rule="sqrt"``)."""
    if base_batch <= 0 or batch <= 0:
        raise ValueError(f"batch sizes must be positive (got base_batch={base_batch}, batch={batch})")
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: expected one of {', '.join(RULES)}")
    factor = batch / base_batch
    return base_lr * (factor if rule == "linear" else math.sqrt(factor))


def shard(batch: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s samples when a global batch of ``batch`` is split over ``world``
    workers as evenly as it goes (the first ``batch % world`` take one more)."""
    size, extra = divmod(batch, world)
    start = rank * size + min(rank, extra)
    return start, start + size + (1 if rank < extra else 0)
