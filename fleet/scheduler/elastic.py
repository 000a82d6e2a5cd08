"""Elastic jobs: the GPU count *and* the global batch size of each, chosen together from each
model's measured scaling (Saxena et al., "Effective Elastic Scaling of Deep Learning Workloads",
MASCOTS 2020). Pure: no Redis, no bus, no clock; the simulator and the controller both call it.

A :class:`~fleet.scheduler.profiles.Profile` is how fast one model trains on N GPUs at global batch
B (measured, or learned from the job's reports). Within the batch range a model's final accuracy is
about the same, so a sample processed at any batch size in the range counts the same toward completion.

:func:`allocate` is the optimizer, in two steps. Admission: in queue order, running jobs keep
running and each waiting job starts if its smallest size fits in what is left (smaller jobs behind
a big one may start: backfill). Sizes: a dynamic program over the admitted jobs x GPUs (a
multiple-choice knapsack, exact) maximises the fleet's useful throughput: each job's samples/s in
units of its own samples/s at its smallest size (its *speedup*, so an ncf sample and an imagenet
sample are not compared; to the power ``SPEEDUP_POWER``, a power mean), or with ``objective=COMPLETION``
its samples/s as a share of the samples it has left (shortest-remaining-first; it needs each job's
``remaining``). Beyond one node a size is whole nodes (a gang of equal members that packs).
A job whose batch is fixed (``fixed_batch``, the paper's baseline) changes only its GPU count,
within what its batch allows per GPU (with gradient accumulation if ``accumulate``).

Goodput: a job that reports its gradient noise scale (``ElasticJob.noise_scale``) is sized by
goodput (samples/s x statistical efficiency, ``fleet.scheduler.goodput``) instead: at each GPU count
the batch of most goodput, reached by gradient accumulation where its per-GPU share does not fit a
GPU, and its value is its goodput relative to its goodput at its smallest size. A larger batch is
then worth it only once the noise scale has grown, so early in training a job runs smaller batches
on fewer GPUs. ``service_s`` (off by default) divides each job's value by
``1 + attained GPU-seconds / service_s``, to at most ten times less (``SERVICE_FLOOR``): least
attained service first, as Tiresias' LAS but smooth, for when the samples a job has left are not
known (live); with them, ``COMPLETION`` already favours short jobs and the weighting only costs
completion time in ``fleet sim``.

Hysteresis (Pollux's restart penalty): a job that has been in the fleet for ``age`` seconds is
expected to need about as long again (``horizon_s`` when given; what it has left when that is known),
and a resize's value is its rate at the new size times the share of that span it would spend making
progress, ``max(span - restarts x resize_cost_s, 0) / (span + resize_cost_s)``: each restart it made
so far counts against it, so a young job or one that restarted often keeps its size unless the new one
is much faster, and a job's time spent restarting stays a small share of its life. The new size must
then beat what it does now by more than ``MIN_GAIN``. No job is resized within ``min_interval_s`` of
its last start or resize (a new job waits for that rather than shrink it early), unless the GPUs
given are fewer than the locked jobs hold; a running job is stopped only when the running jobs'
smallest sizes no longer fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleet.scheduler import goodput
from fleet.scheduler.profiles import MEASURED_GPUS_PER_NODE, Profile

if TYPE_CHECKING:
    from fleet.scheduler.knapsack import Option

#: allocate's objectives: the sum of jobs' speedups (the fleet's useful throughput), or of the
#: share of its remaining work each job does per second (favours jobs near their end: lower
#: average completion time, as shortest-remaining-first does)
SPEEDUP, COMPLETION = "speedup", "completion"
#: seconds a resize costs: SIGTERM, checkpoint, relaunch, framework start-up, restore. fleet's own
#: part (requeue, place, launch) is under a second; the rest is the job's, an estimate for the
#: profiled models' checkpoints (100 MB to a few GB) and communicator start-up. Configurable.
RESIZE_COST_S = 30.0
#: no job is resized again sooner than this after its last start or resize: 4 resize costs, so a
#: job spends at most a fifth of its time resizing
MIN_INTERVAL_S = 120.0
#: a running job changes size only for a gain of more than this share of its value, after the
#: resize's cost (a restart risks more than its seconds, and a few percent holds GPUs others could
#: use better: in Pollux's simulator none made 31 % more restarts and a 1.4 % longer average JCT,
#: a fifth 16 % fewer restarts and a 1.9 % longer one)
MIN_GAIN = 0.1
#: the least the attained-service weight discounts a job to (see :func:`service_weight`): without a
#: floor, a job that has run a day on 16 GPUs counted 1/70 of a new one, so every arrival took GPUs
#: from it and the longest jobs lost most of the fleet to the medium ones (in Pollux's simulator,
#: yolov3 and imagenet made all of fleet's gap to Pollux; a tenth cut the mean avg JCT by 2.4 % at
#: 1x and 1.5 % at 2x)
SERVICE_FLOOR = 0.1
#: a job's value is its speedup to this power (``objective="speedup"``): a power mean, as Pollux's (p = -1)
#: but nearer throughput (p = 1); in Pollux's simulator 0.5 beat 1 at 1x and 2x (BENCHMARKS.md)
SPEEDUP_POWER = 0.5


@dataclass(frozen=True)
class ElasticJob:
    """An elastic job as the optimizer sees it: its ranges, its profile, where it stands."""

    id: str
    tenant: str
    min_gpus: int
    max_gpus: int
    min_batch: int
    max_batch: int
    profile: Profile
    #: current allocation (0 = not running) and global batch size
    gpus: int = 0
    batch: int = 0
    #: the paper's baseline: only the GPU count may change (at ``batch``, else ``min_batch``)
    fixed_batch: bool = False
    #: when it last started or was resized (for the minimum interval between resizes)
    changed_at: float = 0.0
    #: whether it reaches a per-GPU batch larger than fits by gradient accumulation
    accumulate: bool = False
    #: its worth relative to other jobs' (a job's value is weight x speedup)
    weight: float = 1.0
    #: samples it still has to process (inf: unknown): a job about to end is not resized
    remaining: float = math.inf
    #: its gradient noise scale in samples (None: not known): with one, a size's worth is its goodput
    #: (samples/s x statistical efficiency, ``fleet.scheduler.goodput``), not its samples/s, and the
    #: batch at each GPU count is the one of most goodput (with gradient accumulation past what fits)
    noise_scale: float | None = None
    #: GPU-seconds it has run so far (its attained service; see ``allocate``'s ``service_s``)
    attained: float = 0.0
    #: when it was submitted, and how many times it was resized since it first started (the
    #: restart penalty: see :func:`options`)
    arrived_at: float = 0.0
    restarts: int = 0

    def batch_range(self) -> tuple[int, int]:
        if self.fixed_batch:
            fixed = self.batch or self.min_batch
            return fixed, fixed
        return self.min_batch, self.max_batch


def sizes(job: ElasticJob, gpus_per_node: int = MEASURED_GPUS_PER_NODE) -> list[tuple[int, int, float]]:
    """(GPUs, best global batch, samples/s) of each size worth running ``job`` at, smallest first:
    within its ranges, feasible for its profile, each faster than every smaller one. With a noise
    scale (and a batch that may change), goodput instead of samples/s, at the batch of most goodput."""
    lo, hi = job.batch_range()
    least = max(job.min_gpus, 1)
    if job.noise_scale is not None and not job.fixed_batch:
        return _goodput_curve(job.profile, least, job.max_gpus, lo, hi, gpus_per_node, job.noise_scale)
    return _curve(job.profile, least, job.max_gpus, lo, hi, gpus_per_node, job.accumulate)


def rate(job: ElasticJob, gpus: int, batch: int, gpus_per_node: int = MEASURED_GPUS_PER_NODE) -> float:
    """What ``job`` makes at ``gpus`` GPUs and global ``batch``, in the units of :func:`sizes`:
    goodput where it has a noise scale (and a batch that may change), else samples/s."""
    if job.noise_scale is None or job.fixed_batch:
        return job.profile.throughput(gpus, batch, gpus_per_node, job.accumulate)
    if batch < 1:
        return 0.0
    speed = job.profile.throughput(gpus, batch, gpus_per_node, accumulate=True)
    return goodput.goodput(speed, batch, _quantised(job.noise_scale), job.min_batch)


def service_weight(attained: float, service_s: float) -> float:
    """How much a job's value counts by the GPU-seconds it has run (least attained service first, as
    Tiresias' LAS, smoothly): 1 for a new job, halved once it has had ``service_s`` GPU-seconds, a
    third at twice that, and never less than ``SERVICE_FLOOR``; 1 for every job when ``service_s``
    is 0 (off)."""
    if not service_s > 0:
        return 1.0
    return max(1.0 / (1.0 + max(attained, 0.0) / service_s), SERVICE_FLOOR)


def _locked(job: ElasticJob, now: float, min_interval_s: float) -> bool:
    return job.gpus > 0 and now - job.changed_at < min_interval_s


def options(
    job: ElasticJob,
    now: float,
    most: int,
    *,
    resize_cost_s: float = RESIZE_COST_S,
    min_interval_s: float = MIN_INTERVAL_S,
    horizon_s: float | None = None,
    gpus_per_node: int = MEASURED_GPUS_PER_NODE,
    objective: str = SPEEDUP,
    service_s: float = 0.0,
) -> list[Option]:
    """The sizes ``job`` may take (at most ``most`` GPUs) and the value of each: its samples/s in
    units of its samples/s at its smallest size (its speedup, to the power ``SPEEDUP_POWER``; with
    ``objective="completion"``, in units of the samples it has left, its ``remaining`` or else a
    whole run of its profile), times its weight; for a running job that would change, the same of
    its rate times the share of the span ahead it would make progress (:func:`restart_penalty`) and
    ``1 - MIN_GAIN``. A running job inside its minimum interval keeps its size; outside, it keeps it
    only if no smaller size is as fast."""
    curve = sizes(job, gpus_per_node)
    ref = curve[0][2] if curve else 1.0
    if objective == COMPLETION:
        left = job.remaining if math.isfinite(job.remaining) else job.profile.samples
        ref = max(left, 1.0)  # value: weight x samples/s / samples left
    elif objective != SPEEDUP:
        raise ValueError(f"objective {objective!r}: {SPEEDUP!r} or {COMPLETION!r}")
    weight = job.weight * service_weight(job.attained, service_s)
    power = SPEEDUP_POWER if objective == SPEEDUP else 1.0

    def value(made: float) -> float:
        return float(weight * max(made / ref, 0.0) ** power)

    if job.gpus <= 0:
        return [(g, b, value(t)) for g, b, t in curve if g <= most]
    current = rate(job, job.gpus, job.batch, gpus_per_node)
    keep = (job.gpus, job.batch, value(current))
    if _locked(job, now, min_interval_s) and job.gpus <= most:
        return [keep]
    # a size no faster than a smaller one (learned since it started there) holds GPUs for nothing
    worth = any(g == job.gpus for g, _, _ in curve)
    out = [keep] if job.gpus <= most and worth else []
    for g, b, t in curve:
        if g > most or (g, b) == (job.gpus, job.batch):
            continue
        out.append((g, b, value(resized_rate(job, t, now, resize_cost_s, horizon_s))))
    return out


def resized_rate(
    job: ElasticJob, new_rate: float, now: float, resize_cost_s: float, horizon_s: float | None
) -> float:
    """What running ``job`` restarted at a size that makes ``new_rate`` (:func:`rate`'s units) is
    worth against what it makes now: ``new_rate`` times the share of the span ahead it would make
    progress (:func:`restart_penalty`) and ``1 - MIN_GAIN``. The span is ``horizon_s``, else as long
    as the job has been in the fleet (job lengths are heavy-tailed: one that ran long will run long
    again), or what is left of it if shorter."""
    horizon = horizon_s if horizon_s is not None else max(now - job.arrived_at, 0.0)
    span = min(horizon, job.remaining / new_rate)
    return new_rate * restart_penalty(span, job.restarts, resize_cost_s) * (1 - MIN_GAIN)


def restart_penalty(span: float, restarts: int, resize_cost_s: float) -> float:
    """The share of the next ``span`` seconds a job resized now spends making progress, its
    ``restarts`` so far counted against it (Pollux's restart penalty): ``max(span - restarts x cost,
    0) / (span + cost)``. 0 for a job with nothing ahead or that restarted for as long as it has."""
    if not span > 0:
        return 0.0
    return max(span - restarts * resize_cost_s, 0.0) / (span + resize_cost_s)


def allocate(
    jobs: Sequence[ElasticJob],
    gpus: int,
    now: float,
    *,
    resize_cost_s: float = RESIZE_COST_S,
    min_interval_s: float = MIN_INTERVAL_S,
    gpus_per_node: int = MEASURED_GPUS_PER_NODE,
    horizon_s: float | None = None,
    tenant_gpus: Mapping[str, int] | None = None,
    objective: str = SPEEDUP,
    service_s: float = 0.0,
) -> dict[str, tuple[int, int]]:
    """The target (GPUs, global batch) of every job in ``jobs`` ((0, 0): wait), using at most
    ``gpus`` GPUs (those not held by non-elastic jobs), and at most ``tenant_gpus[t]`` for the
    elastic jobs of tenant ``t`` (what its quota leaves after its other jobs).

    1. Admission, in the order of ``jobs`` (pass them in queue order): running jobs keep running
       (at their current size while inside their minimum interval, else at least their smallest);
       each waiting job starts if its smallest size fits in what is left, else it waits and later,
       smaller jobs may still start (backfill). Running jobs are stopped only if even their
       minimums no longer fit, the last in the order first.
    2. Sizes: a dynamic program over the admitted jobs x GPUs (a multiple-choice knapsack, exact)
       maximises the sum of their values (see :func:`options`: speedups, or with
       ``objective="completion"`` the share of its remaining work each does per second), less resize costs.
    ``horizon_s``: how long a new size is expected to last when its gain is weighed against the
    resize cost (default: as long as the job has been in the fleet, ``now - arrived_at``; see
    :func:`restart_penalty`). ``service_s``: weigh
    each job's value by its attained service (:func:`service_weight`; 0: off)."""
    import numpy as np  # here: every controller imports this module, few run elastic jobs

    from fleet.scheduler.knapsack import combine, knapsack, walk

    gpus = max(int(gpus), 0)
    caps = {t: max(int(c), 0) for t, c in (tenant_gpus or {}).items()}
    chosen: dict[str, tuple[int, int]] = {job.id: (0, 0) for job in jobs}
    admitted = _admit(jobs, gpus, caps, now, min_interval_s, gpus_per_node)
    groups: dict[str, list[ElasticJob]] = {}
    for job in admitted:
        groups.setdefault(job.tenant if job.tenant in caps else "", []).append(job)
    tables = []
    for tenant, members in groups.items():
        cap = min(gpus, caps[tenant]) if tenant else gpus
        opts = [
            options(
                job,
                now,
                cap,
                resize_cost_s=resize_cost_s,
                min_interval_s=min_interval_s,
                horizon_s=horizon_s,
                gpus_per_node=gpus_per_node,
                objective=objective,
                service_s=service_s,
            )
            for job in members
        ]
        best, picks = knapsack(opts, cap)
        tables.append((members, opts, best, picks))
    total = np.zeros(gpus + 1)
    splits = []
    for _, _, best, _ in tables:  # the tenants' tables combined: how many GPUs each tenant's jobs get
        total, pick = combine(total, best)
        splits.append(pick)
    left = gpus
    for (members, opts, _, picks), pick in zip(reversed(tables), reversed(splits), strict=True):
        take = int(pick[left])
        left -= take
        for job, (g, b, _) in zip(members, walk(opts, picks, take), strict=True):
            chosen[job.id] = (g, b)
    return chosen


def _admit(
    jobs: Sequence[ElasticJob],
    gpus: int,
    caps: Mapping[str, int],
    now: float,
    min_interval_s: float,
    gpus_per_node: int,
) -> list[ElasticJob]:
    """The jobs that run after this decision (see :func:`allocate`), in the order given."""
    smallest = {job.id: (sizes(job, gpus_per_node) or [(0, 0, 0.0)])[0][0] for job in jobs}
    running = [job for job in jobs if job.gpus > 0]
    # a running job keeps at least its smallest size, or its size while locked; the minimum
    # interval gives way when even that does not fit
    floors = {job.id: min(smallest[job.id] or job.gpus, job.gpus) for job in running}
    locked = {job.id: job.gpus for job in running if _locked(job, now, min_interval_s)}
    strict = _Budget(gpus, caps).fits(running, {**floors, **locked})
    if strict:
        floors.update(locked)
    budget = _Budget(gpus, caps)
    kept = {job.id for job in running if budget.take(job, floors[job.id])}  # the earliest stay
    out = []
    for job in jobs:
        if job.id in kept or (job.gpus <= 0 and smallest[job.id] and budget.take(job, smallest[job.id])):
            out.append(job)
    if not strict:  # locked jobs that must shrink are resized as if unlocked
        out = [replace(job, changed_at=-math.inf) if job.id in locked else job for job in out]
    return out


class _Budget:
    """GPUs left, in all and per capped tenant."""

    def __init__(self, gpus: int, caps: Mapping[str, int]) -> None:
        self.left, self.tenants = gpus, dict(caps)

    def take(self, job: ElasticJob, need: int) -> bool:
        if need > self.left or need > self.tenants.get(job.tenant, need):
            return False
        self.left -= need
        if job.tenant in self.tenants:
            self.tenants[job.tenant] -= need
        return True

    def fits(self, jobs: Sequence[ElasticJob], need: Mapping[str, int]) -> bool:
        return all([self.take(job, need[job.id]) for job in jobs])


def _curve(
    profile: Profile, least: int, most: int, lo: int, hi: int, per_node: int, accumulate: bool
) -> list[tuple[int, int, float]]:
    """(GPUs, best batch, throughput) from ``least`` to ``most`` GPUs, each faster than the last;
    beyond one node only whole nodes (a gang of equal members that packs: 12 GPUs on 4-GPU nodes,
    not 7 members of one GPU each)."""
    key = ("c", least, most, lo, hi, per_node, accumulate)
    found = profile._cache.get(key)
    if found is not None:
        return list(found)
    out: list[tuple[int, int, float]] = []
    for g in range(least, min(most, profile.max_gpus) + 1):
        if g > per_node and g % per_node:
            continue
        t, b = profile.best(g, lo, hi, per_node, accumulate)
        if t > 0 and (not out or t > out[-1][2] * (1 + 1e-9)):
            out.append((g, b, t))
    profile._cache[key] = out
    return out


def _quantised(noise_scale: float) -> float:
    """The noise scale to 2 significant digits: sizes are worked out once per value, not per report."""
    return float(f"{max(noise_scale, 0.0):.2g}")


def _goodput_curve(
    profile: Profile, least: int, most: int, lo: int, hi: int, per_node: int, noise_scale: float
) -> list[tuple[int, int, float]]:
    """As :func:`_curve`, by goodput at ``noise_scale``: at each GPU count the batch of most goodput
    (``goodput.best_batch``; gradient accumulation where its per-GPU share does not fit a GPU)."""
    noise = _quantised(noise_scale)
    key = ("g", least, most, lo, hi, per_node, noise)
    found = profile._cache.get(key)
    if found is not None:
        return list(found)

    def speed(gpus: int, batch: int, steps: int) -> float:
        return profile.throughput(gpus, batch, per_node, accumulate=True)

    limits = goodput.Limits(lo, hi, profile.max_local, accumulate=True)
    out: list[tuple[int, int, float]] = []
    for g in range(least, min(most, profile.max_gpus) + 1):
        if g > per_node and g % per_node:
            continue
        choice = goodput.best_batch(g, noise, speed, limits)
        if choice is not None and (not out or choice.goodput > out[-1][2] * (1 + 1e-9)):
            out.append((g, choice.batch, choice.goodput))
    profile._cache[key] = out
    return out
