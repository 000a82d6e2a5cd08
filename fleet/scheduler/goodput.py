"""Goodput: the training progress a job makes per second at a size, not just its samples/s. Pure.

A larger global batch processes more samples per second, but each sample then counts for less: the
gradient of a large batch is barely better than that of a half-size one once the batch is well past
the gradient noise scale (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018).
Pollux (Qiao et al., OSDI'21) models it as

    goodput(GPUs, M) = throughput(GPUs, M) x efficiency(M)
    efficiency(M)    = (B_noise + M0) / (B_noise + M)

``M0`` is the batch the job was tuned at (fleet: the smallest of its ``batch_size`` range),
``B_noise`` its gradient noise scale in samples (``tr(Sigma) / |G|^2``, which the job estimates while it
trains: ``fleet_worker.GradientNoiseScale``, reported with ``fw.report``). Efficiency is the share of
a sample's worth at ``M0`` that a sample at ``M`` has: 1 at ``M0``, falling in ``M``, about
``B_noise / M`` for ``M`` well past the noise scale. The noise scale grows as training goes on, and
with it the batch worth running at.

What the elastic policy calls:
- :func:`efficiency` and :func:`goodput` for one size;
- :func:`job_goodput`: what a stored job's reports say (its noise scale, efficiency and goodput at
  its size), as ``fleet show`` and the status page show it;
- :func:`best_batch`: the (global batch, micro-batches per step) that maximise goodput on a GPU
  count within a job's :class:`Limits` (what Pollux's ``optimize_bsz`` does), with a
  :data:`Throughput` model: :func:`from_profile` makes one from a measured or learned profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.scheduler.profiles import MEASURED_GPUS_PER_NODE, Profile

if TYPE_CHECKING:
    from fleet.models import Job

#: samples/s of a job on ``gpus`` GPUs at global batch ``batch``, done in ``steps`` micro-batches per
#: optimizer step on each GPU (gradient accumulation; 1: none): 0.0 where it cannot run
Throughput = Callable[[int, int, int], float]

#: global batches :func:`best_batch` tries between a job's smallest and largest (geometric steps, as
#: Pollux's 50), besides the range's ends
CANDIDATES = 50


def efficiency(batch: float, noise_scale: float, initial_batch: float) -> float:
    """The statistical efficiency of global batch ``batch`` relative to ``initial_batch``, for a job
    whose gradient noise scale is ``noise_scale`` samples: ``(B + M0) / (B + M)``, in (0, 1].

    A noise scale of 0 (none measured yet) gives ``M0 / M``: a larger batch buys nothing, which is
    the cautious guess Pollux starts from. A batch below ``initial_batch`` counts as it (1.0): the
    model says nothing about batches smaller than the one the job was tuned at."""
    if not noise_scale >= 0 or math.isinf(noise_scale):
        raise ValueError(f"noise_scale: a finite number of samples, 0 or more (got {noise_scale!r})")
    if not initial_batch > 0 or not batch > 0:
        raise ValueError(
            f"batch sizes must be positive (got batch={batch!r}, initial_batch={initial_batch!r})"
        )
    if batch <= initial_batch:
        return 1.0
    return (noise_scale + initial_batch) / (noise_scale + batch)


def goodput(samples_per_s: float, batch: float, noise_scale: float, initial_batch: float) -> float:
    """Samples/s in units of samples at ``initial_batch``: ``samples_per_s x efficiency``."""
    return samples_per_s * efficiency(batch, noise_scale, initial_batch)


@dataclass(frozen=True)
class Limits:
    """What a job allows: its global batch range (``min_batch`` is the batch it was tuned at, unless
    ``initial_batch`` says otherwise), the largest per-GPU batch that fits a GPU's memory in one pass
    (``max_local``; None: no limit known), and whether it reaches a larger one by gradient
    accumulation (``accumulate``)."""

    min_batch: int
    max_batch: int
    max_local: int | None = None
    accumulate: bool = False
    initial_batch: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.max_batch:
            raise ValueError(
                f"batch range {self.min_batch}-{self.max_batch}: need 1 <= min_batch <= max_batch"
            )
        if self.max_local is not None and self.max_local < 1:
            raise ValueError(f"max_local: at least 1 sample per GPU (got {self.max_local})")

    @property
    def m0(self) -> int:
        return self.initial_batch or self.min_batch


@dataclass(frozen=True)
class Choice:
    """A size's batch: global ``batch``, each GPU's ``local`` share of it per micro-batch, ``steps``
    micro-batches per optimizer step (gradient accumulation when above 1), and what it is worth."""

    gpus: int
    batch: int
    local: int
    steps: int
    throughput: float
    efficiency: float

    @property
    def goodput(self) -> float:
        return self.throughput * self.efficiency


def micro_steps(batch: int, gpus: int, limits: Limits) -> int | None:
    """Micro-batches per step each GPU needs for its share of ``batch`` to fit ``max_local``: 1 when
    it fits in one pass, else the fewest that fit (None when it does not fit and the job does not
    accumulate)."""
    if limits.max_local is None:
        return 1
    steps = max(1, math.ceil(batch / gpus / limits.max_local - 1e-9))
    return steps if steps == 1 or limits.accumulate else None


def candidates(gpus: int, limits: Limits, count: int = CANDIDATES) -> list[int]:
    """The global batches :func:`best_batch` weighs on ``gpus`` GPUs, ascending: ``count`` geometric
    steps over the range, each rounded down to a multiple of ``gpus`` (so it splits evenly) where
    that stays in range, the range's ends, and the largest that fits the GPUs in one pass."""
    lo, hi = limits.min_batch, limits.max_batch
    out = {lo, hi, gpus * (limits.max_local or hi)}
    for i in range(count):
        raw = lo * (hi / lo) ** (i / max(count - 1, 1))
        even = int(raw + 1e-9) // gpus * gpus
        out.add(even if even >= lo else min(-(-lo // gpus) * gpus, hi))
    return sorted(b for b in out if lo <= b <= hi)


def best_batch(gpus: int, noise_scale: float, throughput: Throughput, limits: Limits) -> Choice | None:
    """The global batch (and micro-batches per step) of the most goodput on ``gpus`` GPUs within
    ``limits``, or None when no batch in range can run there. Of batches equally good, the smallest.

    A larger noise scale never makes the chosen batch smaller (goodput's dependence on the noise
    scale favours larger batches the larger it is), so a job's batch grows as its training goes on."""
    if gpus < 1:
        return None
    best: Choice | None = None
    for batch in candidates(gpus, limits):
        steps = micro_steps(batch, gpus, limits)
        if steps is None:
            continue
        rate = throughput(gpus, batch, steps)
        if not rate > 0:
            continue
        choice = Choice(
            gpus,
            batch,
            math.ceil(batch / gpus / steps),
            steps,
            rate,
            efficiency(batch, noise_scale, limits.m0),
        )
        if best is None or choice.goodput > best.goodput * (1 + 1e-12):
            best = choice
    return best


def from_profile(profile: Profile, gpus_per_node: int = MEASURED_GPUS_PER_NODE) -> Throughput:
    """A :data:`Throughput` model from a scaling profile (measured, uploaded or learned): its
    samples/s at the size, with gradient accumulation when more than one micro-batch is asked for
    (the profile takes as few as fit its largest per-GPU batch)."""

    def rate(gpus: int, batch: int, steps: int) -> float:
        return profile.throughput(gpus, batch, gpus_per_node, accumulate=steps > 1)

    return rate


def limits_of(profile: Profile, accumulate: bool = False) -> Limits:
    """A profile's batch range and per-GPU limit as :class:`Limits`."""
    return Limits(profile.min_batch, profile.max_batch, profile.max_local, accumulate)


@dataclass(frozen=True)
class Standing:
    """Where an elastic job stands by its reports: its noise scale, the efficiency of the batch it
    runs at relative to the one it was tuned at, and its goodput (None: no samples/s reported)."""

    noise_scale: float
    batch: int
    initial_batch: int
    efficiency: float
    goodput: float | None

    def __str__(self) -> str:
        worth = f"efficiency {self.efficiency:.2f} at batch {self.batch} (tuned at {self.initial_batch})"
        rate = "" if self.goodput is None else f"; goodput {self.goodput:,.4g} samples/s"
        return f"noise scale {self.noise_scale:,.4g} samples; {worth}{rate}"


def job_goodput(job: Job) -> Standing | None:
    """``job``'s :class:`Standing` from its reports: None unless it is elastic, sized, and reported
    a noise scale. Its samples/s: what it reported at its size, else its last report's."""
    spec_range = job.spec.batch_range
    if not job.noise_scale > 0 or not job.batch_size or not job.num_gpus or spec_range is None:
        return None
    m0 = spec_range[0]
    rate = job.measured.get((job.num_gpus, job.batch_size))
    if rate is None and job.progress is not None:
        rate = job.progress.metrics.get("samples_per_s")
    worth = efficiency(job.batch_size, job.noise_scale, m0)
    return Standing(job.noise_scale, job.batch_size, m0, worth, None if rate is None else rate * worth)
