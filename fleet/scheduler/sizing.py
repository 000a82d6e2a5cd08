"""An elastic job's size: GPUs and a global batch size that splits evenly over them. Pure.

The batch an elastic job runs at is global (``FLEET_BATCH_SIZE``): each of its GPUs takes an equal
share, so a batch is kept to a multiple of the GPU count, within the job's range. A resize that names
no batch scales it with the GPUs (the linear rule the SDK's ``scale_lr`` pairs with).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    gpus: int
    batch: int

    def __str__(self) -> str:
        return f"{self.gpus} GPU{'' if self.gpus == 1 else 's'}, batch {self.batch}"


def fit_batch(batch: int, gpus: int, low: int, high: int) -> int:
    """``batch`` moved to a multiple of ``gpus`` within ``low..high``: the nearest one at or below it,
    else the nearest above; ``batch`` clamped to the range when no multiple lies in it."""
    clamped = min(max(batch, low), high)
    if gpus <= 1:
        return clamped
    below = clamped - clamped % gpus
    if below >= low and below > 0:
        return below
    above = below + gpus
    return above if above <= high else clamped


def scaled_batch(batch: int, gpus: int, to_gpus: int, low: int, high: int) -> int:
    """The batch at ``to_gpus`` GPUs keeping each GPU's share (linear scaling), fit to the range."""
    if not gpus or not batch:
        return fit_batch(low, to_gpus, low, high)
    return fit_batch(round(batch * to_gpus / gpus), to_gpus, low, high)


def change(old: Size, new: Size) -> str:
    """What a resize does, for history: ``1 -> 2 GPUs, batch 128 -> 256``."""
    if not new.gpus:
        return f"{old.gpus} -> 0 GPUs (it waits in the queue until the allocator gives it some)"
    batch = f"batch {old.batch} -> {new.batch}" if old.batch != new.batch else f"batch {new.batch}"
    return f"{old.gpus} -> {new.gpus} GPUs, {batch}"
