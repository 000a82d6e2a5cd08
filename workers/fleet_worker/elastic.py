"""Elastic jobs: what changes when fleet resizes one, and the rule to follow.

fleet may restart an elastic job (``gpus: {min, max}``) at another GPU count and global batch size:
SIGTERM, the job checkpoints and exits, and the next attempt gets ``FLEET_NUM_GPUS`` (workers per
member) and ``FLEET_BATCH_SIZE`` (the global batch) for its new size. The job reads both at every
start, resumes from its checkpoint (steps, model and optimizer state carry over at any size), and
rescales its learning rate with the batch::

    batch = fw.batch_size(256)
    lr = fw.scale_lr(0.1, base_batch=256, batch=batch)      # linear scaling: 0.2 at batch 512

When only its batch changes (it keeps its GPUs), fleet need not restart a job that takes the new
batch up as it runs: one that reads ``fw.batch_size(follow=True)`` every few steps (in a distributed
job, ``fw.dist.batch_agreed``, so that every rank switches at the same step) says so in its reports,
and fleet then gives it the batch of most goodput at its GPUs as its noise scale changes, without a
restart (``FLEET_CONTROL_DIR`` holds the batch now)::

    if step % 20 == 0:
        new = fw.dist.batch_agreed(batch)                   # the same on every rank
        if new != batch:                                    # fleet changed it in place
            batch, lr = new, fw.scale_lr(0.1, base_batch=256, batch=new)
            set_lr(optimizer, lr)                           # and take this rank's new share

Three rules (``rule=``), for a rate ``base_lr`` tuned at ``base_batch``:

- ``"linear"`` (the default; Goyal et al., "Accurate, Large Minibatch SGD", 2017): multiply the rate
  by the factor the batch grew by. For SGD, within the range of batch sizes a model is known to
  train well at (which is what an elastic job's ``batch_size: {min, max}`` declares).
- ``"sqrt"``: by the factor's square root; the usual choice for Adam and its kin.
- ``"adascale"`` (Johnson et al., "AdaScale SGD", ICML 2020; what Pollux uses): by the *gain*
  ``(B + M0) M / ((B + M) M0)`` at batch ``M`` for base batch ``M0`` and gradient noise scale ``B``
  (``noise_scale=``: a number, or the job's ``fw.GradientNoiseScale``). It lies between 1 and the
  linear factor: near linear while the batch is well under the noise scale (each sample counts
  fully), flat well above it (a larger batch only averages out noise that is no longer there). The
  noise scale changes as training goes on: compute the rate again now and then (at each report,
  say) and set it on the optimizer. Before the job has an estimate the gain is 1 (the base rate).
"""

from __future__ import annotations

from typing import Any

RULES = ("linear", "sqrt", "adascale")


def scale_lr(
    base_lr: float, base_batch: int, batch: int, rule: str = "linear", noise_scale: Any = None
) -> float:
    """The learning rate for global batch ``batch``, given ``base_lr`` tuned at ``base_batch``, by
    ``rule``: ``"linear"`` (``base_lr * batch / base_batch``), ``"sqrt"`` (by the square root of that
    factor) or ``"adascale"`` (by the AdaScale gain at ``noise_scale``; see the module's text)."""
    if base_batch <= 0 or batch <= 0:
        raise ValueError(f"batch sizes must be positive (got base_batch={base_batch}, batch={batch})")
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: expected one of {', '.join(RULES)}")
    factor = batch / base_batch
    if rule == "linear":
        return base_lr * factor
    if rule == "sqrt":
        return base_lr * factor**0.5
    return base_lr * gain(base_batch, batch, noise_scale)


def gain(base_batch: int, batch: int, noise_scale: Any = None) -> float:
    """AdaScale's gain ``(B + M0) M / ((B + M) M0)``: how many steps at ``base_batch`` one step at
    ``batch`` is worth, for noise scale ``B`` (a number, or an estimator's ``noise_scale``; None:
    not known yet, a gain of 1)."""
    found = getattr(noise_scale, "noise_scale", noise_scale)
    if found is None:
        return 1.0
    b = float(found)
    if not 0 <= b < float("inf"):
        raise ValueError(f"noise_scale: a finite number of samples, 0 or more (got {found!r})")
    return (b + base_batch) * batch / ((b + batch) * base_batch)


def shard(batch: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s samples when a global batch of ``batch`` is split over ``world``
    workers as evenly as it goes (the first ``batch % world`` take one more)."""
    size, extra = divmod(batch, world)
    start = rank * size + min(rank, extra)
    return start, start + size + (1 if rank < extra else 0)
