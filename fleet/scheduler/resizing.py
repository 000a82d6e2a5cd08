"""The elastic step of a pass: which elastic jobs start or change size, and at what. Pure.

Elastic jobs share what the others leave: the healthy GPUs of schedulable nodes, less those held by
jobs that are not elastic and those the queued ones that are not elastic would take (so a fixed-size
job that arrives makes the elastic ones shrink, instead of waiting behind them). Each tenant's
elastic jobs get at most what its ``max_gpus`` leaves after its other jobs. The optimizer
(``elastic.allocate``) chooses every job's GPUs and global batch; this turns its answer into
:class:`Resize` decisions the controller carries out: a queued job is given the size it starts at,
a running one is stopped to restart at its new one. A running job that follows a batch change in
place (its reports say so: ``fleet_worker.batch_size(follow=True)``) is first given the batch of most
goodput at the GPUs it holds, without a restart, and any other change of its batch alone is made in
place too (:attr:`Resize.in_place`). A job already on its way off its node (a
resize, a drain, a preemption, a cancel under way) is left alone and its GPUs counted as held.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from fleet.models import Job, Range
from fleet.progress import follows_batch
from fleet.scheduler.capacity import Capacity
from fleet.scheduler.elastic import SPEEDUP, ElasticJob, allocate, rate, resized_rate, sizes
from fleet.scheduler.learned import LearnedProfile
from fleet.scheduler.profiles import MEASURED_GPUS_PER_NODE, Profile
from fleet.scheduler.sizing import Size, fit_batch, scaled_batch
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob


@dataclass(frozen=True)
class Elastic:
    """One elastic job as the step sees it."""

    id: str
    tenant: str
    min_gpus: int
    max_gpus: int
    min_batch: int
    max_batch: int
    #: bundled, uploaded, or learned from its reports (``fleet.state.profiles.ProfileStore.profile_of``)
    profile: Profile
    #: its size now: running, its attempt's; queued, the size it was given (0 GPUs: none yet)
    size: Size
    running: bool
    #: on its way off its node (resize, drain, preemption, cancel): not to be resized again now
    stopping: bool = False
    #: when it last started or changed size (the minimum interval between resizes counts from it)
    changed_at: float = 0.0
    #: one batch size at every size (the spec gave one value, not a range)
    fixed_batch: bool = False
    #: stopping for a resize: the GPUs it comes back with (held for it meanwhile)
    resize_to: int | None = None
    #: samples it still has to process (inf: unknown, as live) and whether it may accumulate gradients
    #: past what fits a GPU (the simulator's baselines); see ``ElasticJob``
    remaining: float = math.inf
    accumulate: bool = False
    #: its gradient noise scale in samples (None: none reported: sized by samples/s) and the
    #: GPU-seconds it has run; see ``ElasticJob``
    noise_scale: float | None = None
    attained: float = 0.0
    #: when it was submitted and how often it was resized (the restart penalty; see ``ElasticJob``)
    arrived_at: float = 0.0
    restarts: int = 0
    #: it follows a change of its batch while it runs (``fleet_worker.batch_size(follow=True)``, as
    #: its attempt's reports say): such a change needs no restart
    follows_batch: bool = False

    @classmethod
    def of(cls, job: Job, profile: Profile, now: float = 0.0) -> Elastic:
        """An elastic job as stored (queued, sized or not, or on its nodes), its attained service
        counted to ``now``."""
        spec, running, going = job.spec, job.state.on_node, job.resize_gpus
        assert isinstance(spec.gpus, Range) and spec.batch_range is not None
        low, high = spec.batch_range
        return cls(
            id=job.id,
            tenant=spec.tenant,
            min_gpus=spec.gpus.min,
            max_gpus=spec.gpus.max,
            min_batch=low,
            max_batch=high,
            profile=profile,
            size=Size(job.num_gpus, job.batch_size),
            running=running,
            stopping=running and bool(going is not None or job.preempt or job.cancel_requested),
            changed_at=max(job.sized_at, job.started_at or 0.0),
            resize_to=going if running else None,
            fixed_batch=not isinstance(spec.batch_size, Range),
            noise_scale=job.noise_scale if job.noise_scale > 0 else None,
            attained=job.attained_gpu_s(now),
            arrived_at=job.created_at,
            restarts=job.resizes,
            follows_batch=running and follows_batch(job.progress),
        )

    @property
    def held(self) -> int:
        """GPUs a stopping job keeps from the others: those it comes back with."""
        return self.size.gpus if self.resize_to is None else self.resize_to


@dataclass(frozen=True)
class Resize:
    job_id: str
    old: Size
    new: Size
    #: a running job (stopped to restart at ``new``); else a queued one (placed at ``new``)
    running: bool
    #: a running job's batch alone changes, and it follows that while it runs: no restart
    in_place: bool = False

    @property
    def restarts(self) -> bool:
        """A running job stopped to restart at ``new``: its GPUs come free (not one rebatched in place)."""
        return self.running and not self.in_place


def elastic_gpus(
    views: Iterable[NodeView], elastic: Iterable[str], pending: Iterable[PendingJob], limit: int = 256
) -> int:
    """GPUs for elastic jobs: healthy ones on schedulable nodes, free or held by an elastic job, less
    those the queued jobs that are not elastic would take if the elastic ones gave all theirs up
    (placed as the pass would, best ranked first, the first ``limit`` of them): a fixed-size job that
    could not start even then takes nothing from them."""
    ids, views = set(elastic), list(views)
    freed = [_free_elastic(v, ids) for v in views]
    usable = sum(1 for v in freed if v.schedulable for g in v.gpus if g.free)
    # on a cordoned node, what its elastic jobs hold stays theirs (a cordon leaves running jobs be)
    usable += sum(1 for v in views if not v.schedulable for g in v.gpus if _holder(g) in ids)
    capacity = Capacity(freed)
    waiting = sorted((j for j in pending if not j.elastic and not j.hold and j.gpus), key=lambda j: j.rank)
    asked = sum(j.gpus for j in waiting[:limit] if capacity.place(j) is not None)
    return max(usable - asked, 0)


def _free_elastic(view: NodeView, elastic: set[str]) -> NodeView:
    """``view`` with the GPUs elastic jobs hold counted free."""
    gpus = tuple(replace(g, free=True, why="", holder="") if _holder(g) in elastic else g for g in view.gpus)
    return replace(view, gpus=gpus)


def _holder(gpu: GpuSlot) -> str:
    return gpu.holder.rsplit(":", 1)[0]


def largest_node(views: Iterable[NodeView]) -> int:
    """GPUs of the biggest node (how the allocator expects a job to be split into members)."""
    return max((sum(g.healthy for g in v.gpus) for v in views), default=0) or MEASURED_GPUS_PER_NODE


def decide(
    jobs: Sequence[Elastic],
    gpus: int,
    now: float,
    *,
    resize_cost_s: float,
    min_interval_s: float,
    gpus_per_node: int,
    tenant_gpus: Mapping[str, int] | None = None,
    objective: str = SPEEDUP,
    horizon_s: float | None = None,
    service_s: float = 0.0,
) -> list[Resize]:
    """The resizes that put every elastic job (in queue order: running first, then by rank) at the
    size the allocator chooses for it, with ``gpus`` GPUs among them."""
    before = [j for j in jobs if not j.stopping]
    moving = [_rebatched(j, gpus_per_node) for j in before]
    held = sum(j.held for j in jobs if j.stopping)
    caps = dict(tenant_gpus or {})
    for j in jobs:
        if j.stopping and j.tenant in caps:
            caps[j.tenant] -= j.held
    targets = allocate(
        [_job(j) for j in moving],
        max(gpus - held, 0),
        now,
        resize_cost_s=resize_cost_s,
        min_interval_s=min_interval_s,
        gpus_per_node=gpus_per_node,
        tenant_gpus=caps,
        objective=objective,
        horizon_s=horizon_s,
        service_s=service_s,
    )
    out = []
    for was, j in zip(before, moving, strict=True):
        g, b = targets.get(j.id, (0, 0))
        new = Size(g, _batch(j, g, b)) if g else Size(0, 0)
        if new != was.size:
            in_place = was.running and was.follows_batch and new.gpus == was.size.gpus
            out.append(Resize(j.id, was.size, new, was.running, in_place))
    return out


def _rebatched(job: Elastic, gpus_per_node: int) -> Elastic:
    """``job`` at the batch of most goodput at the GPUs it holds, where it runs, follows a batch change
    in place and has a noise scale (the allocator then sizes it from there); else as it is."""
    if not (job.running and job.follows_batch and job.noise_scale is not None and not job.fixed_batch):
        return job
    for g, b, _ in sizes(_job(job), gpus_per_node):
        if g == job.size.gpus:
            return replace(job, size=Size(g, _batch(job, g, b)))
    return job


def smaller_sizes(job: Elastic, below: int, gpus_per_node: int) -> list[Size]:
    """``job``'s sizes worth running at on fewer than ``below`` GPUs, the largest first."""
    return [Size(g, _batch(job, g, b)) for g, b, _ in reversed(sizes(_job(job), gpus_per_node)) if g < below]


def smaller_growth(
    job: Elastic,
    below: int,
    now: float,
    *,
    resize_cost_s: float,
    gpus_per_node: int,
    horizon_s: float | None = None,
) -> list[Size]:
    """For running ``job`` the step grows to ``below`` GPUs: its sizes between that and the one it
    runs at that would pay for their restart by the step's own rule (``elastic.resized_rate``), the
    largest first."""
    j = _job(job)
    now_rate = rate(j, j.gpus, j.batch, gpus_per_node)
    return [
        Size(g, _batch(job, g, b))
        for g, b, t in reversed(sizes(j, gpus_per_node))
        if j.gpus < g < below and resized_rate(j, t, now, resize_cost_s, horizon_s) > now_rate
    ]


def unrunnable(job: Elastic) -> str:
    """Why the profile gives ``job`` no size to run at within its ranges ('' when it has one): such a
    job would never be sized, so a submit refuses it."""
    profile = job.profile
    if sizes(_job(job)):
        return ""
    batch = str(job.min_batch) if job.fixed_batch else f"{job.min_batch}-{job.max_batch}"
    most = profile.max_local
    if most is not None and job.max_gpus * most < job.min_batch:
        fix = "raise max_batch_per_gpu or the GPUs, or lower the batch size"
        return f"max_batch_per_gpu {most}: {job.min_batch} on {job.max_gpus} GPUs is more per GPU; {fix}"
    if isinstance(profile, LearnedProfile):  # it starts at its smallest size, nothing known yet
        fix = "raise max_batch_per_gpu or the least GPUs, or lower the batch size"
        per_gpu = profile.largest_local
        return f"a global batch of {batch} on {job.min_gpus} GPUs is more than {per_gpu:g} per GPU; {fix}"
    return (
        f"profile {profile.name} has no measured throughput at {job.min_gpus}-{job.max_gpus} GPUs with a "
        f"global batch of {batch} (it was measured at batch sizes "
        f"{profile.min_batch}-{profile.max_batch}, up to {profile.max_gpus} GPUs): widen the ranges "
        "or choose another profile"
    )


def starting_sizes(jobs: Iterable[Elastic]) -> list[Resize]:
    """With the elastic step off: each queued job not sized yet starts at its smallest size (a manual
    ``fleet resize`` still changes it)."""
    return [
        Resize(j.id, j.size, Size(j.min_gpus, _batch(j, j.min_gpus, 0)), False)
        for j in jobs
        if not j.running and not j.size.gpus
    ]


def _batch(job: Elastic, gpus: int, batch: int) -> int:
    """The allocator's batch, split evenly over the GPUs within the job's range (a fixed one kept)."""
    if job.fixed_batch:
        return job.min_batch
    if not batch:
        return scaled_batch(job.size.batch, job.size.gpus, gpus, job.min_batch, job.max_batch)
    return fit_batch(batch, gpus, job.min_batch, job.max_batch)


def _job(j: Elastic) -> ElasticJob:
    """What the allocator sees: a queued job has no GPUs (its size is only a plan until it starts)."""
    running = j.size if j.running else Size(0, 0)
    job = ElasticJob(
        j.id,
        j.tenant,
        j.min_gpus,
        j.max_gpus,
        j.min_batch,
        j.max_batch,
        j.profile,
        gpus=running.gpus,
        batch=running.batch or j.min_batch,
        fixed_batch=j.fixed_batch,
        changed_at=j.changed_at,
        accumulate=j.accumulate,
        remaining=j.remaining,
        noise_scale=j.noise_scale,
        attained=j.attained,
        arrived_at=j.arrived_at,
        restarts=j.restarts,
    )
    return replace(job, batch=running.batch) if running.gpus else job
