"""One scheduling pass: what the controller's leader runs and what ``fleet sim`` runs. Pure.

:func:`run_pass` takes everything a pass needs (:class:`PassInput`) and returns what to do
(:class:`PassPlan`); the caller carries the plan out: the controller with fenced writes and bus
messages (``fleet.controller.apply``), the simulator on its own bookkeeping (``fleet.sim.engine``).
It composes the scheduler's policies in this order:

Jobs a user holds (``fleet hold``: ``PendingJob.held_by``) stay in the queue, with their reason, and
take no part: not sized, not placed, not preempted for.

1. Holds: GPUs being freed by a preemption stay held for the job it was for, until that job is
   placed or leaves the queue, or the hold runs out (its victims' grace plus ``HOLD_SLACK_S``).
2. The elastic step (``resizing.decide``, with each tenant's ``max_gpus`` left after its other
   jobs): queued elastic jobs are sized (they take that size in the queue at once, so this pass
   places them), running ones are to stop and restart at a new size, or, when only the batch of
   one that follows such a change in place changes, to take it up where they run.
3. Placement (``PendingQueue.schedule``): tenants in fair-share order, held GPUs first for the job
   they are held for. The step sizes by GPU count, not by the shape the free GPUs are in: a queued
   elastic job that found no room at its size takes the largest of its smaller sizes that places
   now (a gang of whole nodes while the running jobs are spread over them would otherwise wait,
   and reserve the nodes, until they end; the next step may grow it again). A running job the
   step grows is checked the same way before it is stopped: it grows as far as the nodes will
   hold once every resized job has left its GPUs, or keeps running where it is.
4. Preemption (``preempt.preemptions``) for the first ``MAX_BLOCKED`` jobs placement could not place
   (none that already has a hold, nor one that fits once this pass's running resizes gave their
   GPUs back), against what runs plus what this pass placed.

The queue is the caller's working state: sized jobs take their size there and placed jobs leave it,
as ``PendingQueue.schedule`` always did. Nothing else is changed; no I/O, no clock (``now`` is given).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet.models import Tenant
from fleet.scheduler.capacity import Capacity
from fleet.scheduler.elastic import MIN_INTERVAL_S, RESIZE_COST_S, SPEEDUP
from fleet.scheduler.fairshare import WEEK, FairShare, Use, fleet_size
from fleet.scheduler.preempt import Preemption, RunningJob, preemptions, without
from fleet.scheduler.queue import PendingQueue
from fleet.scheduler.resizing import (
    Elastic,
    Resize,
    decide,
    elastic_gpus,
    largest_node,
    smaller_growth,
    smaller_sizes,
    starting_sizes,
)
from fleet.scheduler.sizing import Size
from fleet.scheduler.snapshot import UNSIZED, NodeView, PendingJob, Placement, Plan, taken

#: how long past its victims' grace a hold lasts (their agents report the exit, GPUs are released)
HOLD_SLACK_S = 60.0
#: waiting jobs considered for preemption per pass (the first the pass could not place)
MAX_BLOCKED = 16


@dataclass(frozen=True)
class Hold:
    """GPUs on their way to a waiting job that preempted their jobs (``victims``)."""

    gpus: frozenset[str]
    victims: frozenset[str]
    until: float


@dataclass(frozen=True)
class PassSettings:
    """The controller settings a pass reads (``ControllerSettings`` live; ``SimConfig`` simulated)."""

    preemption: bool = True
    #: size elastic jobs with the allocator and resize running ones (else: each starts at its smallest)
    elastic: bool = True
    resize_cost_s: float = RESIZE_COST_S
    min_interval_s: float = MIN_INTERVAL_S
    half_life_s: float = WEEK
    #: the allocator's objective and horizon (``fleet.scheduler.elastic.allocate``)
    objective: str = SPEEDUP
    horizon_s: float | None = None
    #: weigh elastic jobs by attained service: GPU-seconds that halve a job's value (0: off)
    service_s: float = 0.0


@dataclass
class PassInput:
    queue: PendingQueue
    views: Sequence[NodeView]
    policies: Mapping[str, Tenant]
    #: every job on a node (being started, running, stopping), as preemption sees it
    running: Mapping[str, RunningJob]
    #: each tenant's decayed GPU-seconds (fair share's memory of the past)
    usage: Mapping[str, float]
    holds: Mapping[str, Hold]
    settings: PassSettings = field(default_factory=PassSettings)
    #: every elastic job queued or on a node, running ones first, then by rank (what the step sizes)
    elastic: Sequence[Elastic] = ()
    #: run the elastic step this pass (something changed, or its interval came round)
    resize: bool = False
    #: run placement this pass (something changed, or a retry backoff ended; a sized job adds one)
    place: bool = True
    #: when placement does not run: the jobs the last placement could not place
    blocked: Sequence[str] = ()
    #: how many more tasks each array with a ``max_running`` may start
    array_room: Mapping[str, int] = field(default_factory=dict)


@dataclass
class PassPlan:
    #: the elastic step's decisions, in its order: queued jobs sized, running jobs to restart resized
    #: (or, ``in_place``, given a new batch where they run)
    resizes: list[Resize] = field(default_factory=list)
    #: placement's plan: placements (launches), waiting reasons that changed, jobs blocked
    placed: Plan = field(default_factory=Plan)
    #: victims to stop, each with its reason, for the job named
    preemptions: list[Preemption] = field(default_factory=list)
    #: the holds still in force (those of jobs placed, gone or past their time are let go)
    holds: dict[str, Hold] = field(default_factory=dict)
    #: the jobs placement could not place (this pass's, or the last one's when it did not run)
    blocked: list[str] = field(default_factory=list)

    @property
    def stops(self) -> list[Resize]:
        """Running elastic jobs the step stops outright (sized 0: even their minimum no longer fits)."""
        return [r for r in self.resizes if r.running and not r.new.gpus]

    @property
    def placements(self) -> list[Placement]:
        return self.placed.placements


def run_pass(inp: PassInput, now: float) -> PassPlan:
    queue, settings = inp.queue, inp.settings
    plan = PassPlan(holds={j: h for j, h in inp.holds.items() if j in queue and now <= h.until})
    place = inp.place
    if inp.resize and inp.elastic:
        plan.resizes = _resizes(inp, now)
        for change in plan.resizes:
            if not change.running and change.job_id in queue:
                queue.add(pending_elastic(queue.jobs[change.job_id], change.new.gpus))
                place = True
    running = dict(inp.running)
    for change in plan.resizes:  # asked to leave for a resize: its GPUs come free anyway, not a victim
        if change.restarts and change.job_id in running:
            running[change.job_id] = dataclasses.replace(running[change.job_id], stopping=True)
    views = list(inp.views)
    if place:
        fair = _fair(inp.policies, running.values(), inp.usage, views, settings)
        held = {j: set(h.gpus) for j, h in plan.holds.items()}
        plan.placed = queue.schedule(Capacity(views), now, inp.array_room, fair, held)
        plan.blocked = plan.placed.blocked
        plan.holds = {j: h for j, h in plan.holds.items() if j in queue}
        running.update(_placed(plan.placed))
        views = _taken(views, plan.placed.placements)
        if inp.elastic and plan.blocked:
            fitted = _fit_misfits(inp, plan, views)
            running.update(_placed(fitted))
            views = _taken(views, fitted.placements)
    else:
        plan.blocked = list(inp.blocked)
    _fit_growth(inp, plan, running, views, now)
    if settings.preemption and plan.blocked:
        plan.preemptions = _preemptions(inp, plan, running, views, now)
    return plan


def _fit_misfits(inp: PassInput, plan: PassPlan, views: list[NodeView]) -> Plan:
    """Queued elastic jobs placement could not place at their size, placed at a smaller one that fits
    now (added to ``plan``: a queued resize, then the placement); the placements made."""
    elastic = {e.id: e for e in inp.elastic if not e.running}
    capacity, per_node, fitted = Capacity(views), largest_node(views), Plan()
    for job_id in list(plan.blocked):
        job, step = inp.queue.jobs.get(job_id), elastic.get(job_id)
        if job is None or step is None or not job.gpus:
            continue
        for size in smaller_sizes(step, job.gpus, per_node):
            smaller = dataclasses.replace(job, gpus=size.gpus)
            placements = capacity.place(smaller)
            if placements is None:
                continue
            sized = [r for r in plan.resizes if r.job_id == job_id]
            old = sized[0].old if sized else step.size
            plan.resizes = [r for r in plan.resizes if r.job_id != job_id] + [
                Resize(job_id, old, size, False)
            ]
            for p in placements:
                plan.placed.placements.append(p)
                fitted.placements.append(p)
            plan.placed.jobs[job_id] = fitted.jobs[job_id] = smaller
            plan.placed.waiting.pop(job_id, None)
            plan.blocked.remove(job_id)
            inp.queue.discard(job_id)
            break
    return fitted


def _fit_growth(
    inp: PassInput, plan: PassPlan, running: dict[str, RunningJob], views: Sequence[NodeView], now: float
) -> None:
    """Running elastic jobs the step grows that the nodes could not hold at their new size once every
    job it resizes has left its GPUs (those that shrink or keep their GPU count placed first, then
    the growing ones in the step's order), after this pass's placements: each grows to the largest
    of its sizes above the one it runs at that they could hold and that still pays for the restart
    (``resizing.smaller_growth``), else keeps running at its size and on its GPUs (back in
    ``running``, its resize out of ``plan``). A restart that would find no room (its GPUs spread
    over nodes a whole-node gang cannot use) is not made, nor one that lands it on other GPUs at the
    size it had."""
    moving = [r for r in plan.resizes if r.restarts and r.new.gpus and r.job_id in inp.running]
    if not any(r.new.gpus > r.old.gpus for r in moving):
        return
    capacity = Capacity(without(views, [inp.running[r.job_id] for r in moving]))
    steps, per_node = {e.id: e for e in inp.elastic}, largest_node(views)
    out: dict[str, Size | None] = {}
    for r in sorted(moving, key=lambda r: r.new.gpus > r.old.gpus):
        job, growing = inp.running[r.job_id], r.new.gpus > r.old.gpus
        step = steps.get(r.job_id)
        tried = [r.new]
        if growing and step is not None:
            tried += smaller_growth(
                step,
                r.new.gpus,
                now,
                resize_cost_s=inp.settings.resize_cost_s,
                gpus_per_node=per_node,
                horizon_s=inp.settings.horizon_s,
            )
        for size in tried:
            again = PendingJob(
                r.job_id, job.priority, 0, size.gpus, cpus=job.cpus, memory=job.memory, tenant=job.tenant
            )
            if capacity.place(again) is not None:
                if size != r.new:
                    out[r.job_id] = size
                break
        else:
            if growing:
                out[r.job_id] = None
                capacity.withhold(set(job.uuids))  # it stays where it is
    resizes = []
    for r in plan.resizes:
        fitted = out.get(r.job_id, r.new)
        if fitted is None:  # it keeps running at its size: no restart
            running[r.job_id] = inp.running[r.job_id]
        else:
            resizes.append(r if fitted == r.new else dataclasses.replace(r, new=fitted))
    plan.resizes = resizes


def _resizes(inp: PassInput, now: float) -> list[Resize]:
    """The elastic step (``resizing``): sizes for the queued, new sizes for the running."""
    queued = inp.queue.jobs
    jobs = [e for e in inp.elastic if e.running or (e.id in queued and not queued[e.id].held_by)]
    settings = inp.settings
    if not settings.elastic:
        return starting_sizes(jobs)
    ids = {e.id for e in jobs}
    gpus = elastic_gpus(inp.views, ids, inp.queue.jobs.values())
    return decide(
        jobs,
        gpus,
        now,
        resize_cost_s=settings.resize_cost_s,
        min_interval_s=settings.min_interval_s,
        gpus_per_node=largest_node(inp.views),
        tenant_gpus=tenant_room(inp.policies, inp.running, ids),
        objective=settings.objective,
        horizon_s=settings.horizon_s,
        service_s=settings.service_s,
    )


def tenant_room(
    policies: Mapping[str, Tenant], running: Mapping[str, RunningJob], elastic: Iterable[str]
) -> dict[str, int]:
    """What each tenant with a ``max_gpus`` may give its elastic jobs: the max less its other jobs'."""
    ids = set(elastic)
    room = {t: p.max_gpus for t, p in policies.items() if p.max_gpus is not None}
    for r in running.values():
        if r.tenant in room and r.id not in ids:
            room[r.tenant] -= r.gpus
    return {t: max(left, 0) for t, left in room.items()}


def holdings(running: Iterable[RunningJob]) -> dict[str, Use]:
    """What each tenant's jobs on nodes hold."""
    held: dict[str, Use] = {}
    for r in running:
        members = len(r.members)
        held[r.tenant] = held.get(r.tenant, Use()).plus(r.gpus, r.cpus * members, r.memory * members)
    return held


def _fair(
    policies: Mapping[str, Tenant],
    running: Iterable[RunningJob],
    usage: Mapping[str, float],
    views: Sequence[NodeView],
    settings: PassSettings,
) -> FairShare:
    return FairShare(policies, holdings(running), usage, fleet_size(views), settings.half_life_s)


def _placed(plan: Plan) -> dict[str, RunningJob]:
    """This pass's placements as jobs on nodes (not started: never a victim)."""
    members: dict[str, list[Placement]] = {}
    for p in plan.placements:
        members.setdefault(p.job_id, []).append(p)
    out = {}
    for job_id, where in members.items():
        job = plan.jobs[job_id]
        out[job_id] = RunningJob(
            job_id,
            0,
            job.tenant,
            job.priority,
            job.gpus,
            tuple((p.node, p.gpus) for p in where),
            job.cpus,
            job.memory,
        )
    return out


def _taken(views: list[NodeView], placements: Sequence[Placement]) -> list[NodeView]:
    """``views`` with what ``placements`` took: preemption plans on the nodes as they now are."""
    by_node: dict[str, list[Placement]] = {}
    for p in placements:
        by_node.setdefault(p.node, []).append(p)
    return [taken(view, by_node.get(view.name, []), lambda p: p.job_id) for view in views]


def _preemptions(
    inp: PassInput, plan: PassPlan, running: Mapping[str, RunningJob], views: list[NodeView], now: float
) -> list[Preemption]:
    """Preemptions for the jobs placement could not place (none already preempted for)."""
    queue = inp.queue
    waiting = [queue.jobs[j] for j in plan.blocked if j in queue.jobs and j not in plan.holds][:MAX_BLOCKED]
    # a job that fits once this pass's running resizes gave their GPUs back waits for those: the
    # elastic step shrank them to make room, a victim stopped too would be placed again at once
    resized = [running[r.job_id] for r in plan.resizes if r.restarts and r.job_id in running]
    if resized:
        freed = without(views, resized)
        waiting = [j for j in waiting if Capacity(freed).place(j) is None]
    if not waiting:
        return []
    fair = _fair(inp.policies, running.values(), inp.usage, views, inp.settings)
    for job_id in plan.holds:  # GPUs on their way to a job count as its tenant's already: a tenant
        fair.add(queue.jobs[job_id])  # below its guarantee is not preempted for twice over
    demand = Counter({t: u.gpus for t, u in fair.held.items()})
    demand.update(queue.demand)
    return preemptions(waiting, list(running.values()), views, fair, demand, now)


def pending_elastic(job: PendingJob, gpus: int) -> PendingJob:
    """Queued elastic ``job`` at ``gpus`` GPUs (0: not sized, it waits for the step)."""
    if job.held_by:  # sized while held: it still waits for its release
        return dataclasses.replace(job, gpus=gpus)
    return dataclasses.replace(job, gpus=gpus, hold="" if gpus else UNSIZED)
