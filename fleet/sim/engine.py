"""The simulator: a trace on a virtual clock, scheduled by the controller's own pure code.

Every pass is what the leader does, with simulated nodes instead of Redis: waiting jobs sit in a
:class:`~fleet.scheduler.queue.PendingQueue` and are placed by its ``schedule`` on a
:class:`~fleet.scheduler.capacity.Capacity` built from the nodes' GPUs (gangs span nodes, large jobs
reserve nodes), in the order :class:`~fleet.scheduler.fairshare.FairShare` gives (tenants' weights,
guarantees and limits, decayed usage folded by :func:`~fleet.scheduler.usage.accrue`), with
:func:`~fleet.scheduler.preempt.preemptions` for tenants below their guarantee. The elastic
policies add :func:`~fleet.scheduler.elastic.allocate` before each pass: it chooses every elastic
job's size; running jobs are resized (their GPUs placed again by ``Capacity``), waiting jobs it
admits enter the queue at the size it chose.

Time moves from event to event (arrivals, completions, a resized job's minimum interval ending), and
a pass runs after each instant's events. A job's progress is piecewise linear: samples/s from its
profile at its size and batch (a workload job) or 1 s/s (a Philly job, which runs its duration). A
resize or a restart after preemption stops progress for ``resize_cost_s`` (checkpoint + restart);
a preempted job gives its GPUs back at once (its checkpoint time is that restart cost) and keeps
its progress. Tenants' ``min_run_s`` holds as in the controller.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleet.models import Tenant
from fleet.scheduler.capacity import Capacity
from fleet.scheduler.elastic import COMPLETION, MIN_INTERVAL_S, RESIZE_COST_S, ElasticJob, allocate, sizes
from fleet.scheduler.fairshare import WEEK, FairShare, Use, fair_gpus
from fleet.scheduler.preempt import RunningJob, preemptions
from fleet.scheduler.profiles import LearnedProfile, Profile, named_profile
from fleet.scheduler.queue import PendingQueue
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob, Placement
from fleet.scheduler.usage import accrue
from fleet.sim.metrics import Recorder, SimResult
from fleet.sim.traces import TraceJob

POLICIES = ("fifo", "fair", "elastic-fixed-batch", "elastic")
ELASTIC = ("elastic-fixed-batch", "elastic")
#: profiles were measured on nodes of 4 GPUs: the default node size
GPUS_PER_NODE = 4
GiB = 1 << 30
ARRIVE, FINISH, WAKE = 0, 1, 2


@dataclass(frozen=True)
class SimConfig:
    policy: str = "fifo"
    gpus: int = 64
    #: nodes the GPUs are spread over (equal); default: nodes of 4 GPUs
    nodes: int | None = None
    #: stop the clock here (seconds); None: when every job has ended or can never start
    until: float | None = None
    resize_cost_s: float = RESIZE_COST_S
    min_interval_s: float = MIN_INTERVAL_S
    #: tenants' policies (weight, guarantee, max) for ``fair``; absent tenants get the default
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    half_life_s: float = WEEK
    #: elastic-fixed-batch: may a job reach its batch on few GPUs by gradient accumulation
    #: (the paper's baseline may not: its per-GPU batch must fit a GPU)
    accumulate: bool = False
    #: elastic jobs' GPU range (max: None = the profile's measured maximum)
    min_gpus: int = 1
    max_gpus: int | None = None
    #: what the elastic policy maximises (``elastic.SPEEDUP`` or ``elastic.COMPLETION``)
    objective: str = COMPLETION
    #: the horizon a resize's cost is spread over (None: the policy's default)
    horizon_s: float | None = None
    #: elastic jobs sized by what they ran at, as ``profile: learn`` live (``LearnedProfile``), not by
    #: the measured profile their throughput comes from: what knowing a job's scaling is worth
    learn: bool = False
    #: learning jobs declare the largest per-GPU batch that fits (``max_batch_per_gpu``: their
    #: profile's largest on one GPU); else they never exceed the largest they ran at
    learn_max_local: bool = True

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}: one of {', '.join(POLICIES)}")
        nodes = self.node_count
        if self.gpus < 1 or nodes < 1 or self.gpus % nodes:
            raise ValueError(f"{self.gpus} GPUs cannot be spread evenly over {nodes} nodes")

    @property
    def node_count(self) -> int:
        return self.nodes if self.nodes is not None else max(self.gpus // GPUS_PER_NODE, 1)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.node_count


@dataclass
class SimJob:
    trace: TraceJob
    seq: int
    profile: Profile | None
    #: samples (a workload job) or seconds (a duration job) to process
    work: float
    elastic: bool
    done: float = 0.0
    rate: float = 0.0
    since: float = 0.0
    #: no progress until then (a resize or restart under way)
    paused_until: float = 0.0
    gpus: int = 0
    batch: int = 0
    members: list[Placement] = field(default_factory=list)
    started: float | None = None
    #: when it last started (for preemption's min_run_s)
    running_since: float | None = None
    ended: float | None = None
    changed_at: float = 0.0
    resizes: int = 0
    preemptions: int = 0
    #: it ran before: its next start restores a checkpoint (costs resize_cost_s)
    restarting: bool = False
    version: int = 0
    #: samples/s at each (GPUs, batch) it ran at (a job reports them live; here, known at once: a
    #: report comes well within the minimum interval before its next resize)
    observed: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.trace.id

    @property
    def tenant(self) -> str:
        return self.trace.tenant

    def advance(self, now: float) -> None:
        start = max(self.since, self.paused_until)
        if self.rate > 0 and now > start:
            self.done = min(self.work, self.done + self.rate * (now - start))
        self.since = now

    def finish_at(self, now: float) -> float:
        if self.rate <= 0:
            return math.inf
        return max(now, self.paused_until) + max(self.work - self.done, 0.0) / self.rate


class Simulation:
    def __init__(self, jobs: Sequence[TraceJob], config: SimConfig) -> None:
        config.check()
        self.cfg = config
        self.per_node = config.gpus_per_node
        width = max(len(str(config.node_count - 1)), 3)
        self.node_names = [f"n{i:0{width}d}" for i in range(config.node_count)]
        #: each node's GPUs: the job holding each, or ""
        self.holders: dict[str, list[str]] = {n: [""] * self.per_node for n in self.node_names}
        self._views: dict[str, NodeView] = {}
        self.jobs: dict[str, SimJob] = {}
        self.queue = PendingQueue()
        #: elastic jobs waiting to be admitted (in arrival order)
        self.waiting: dict[str, SimJob] = {}
        self.running: dict[str, SimJob] = {}
        self.usage: dict[str, float] = {}
        #: GPUs each tenant's jobs hold, and GPUs its rigid jobs wait for
        self.held: Counter[str] = Counter()
        self.queued_gpus: Counter[str] = Counter()
        self.events: list[tuple[float, int, int, str, int]] = []
        self.unfinished = len(jobs)
        self._tick = 0
        self.now = 0.0
        self.recorder = Recorder(config.gpus)
        self.fallbacks = 0
        #: resizes the policy chose that found no room in the shape they needed
        self.misfits = 0
        self.moves = 0
        #: the elastic policy's last decision: (GPUs, batch) by job
        self._targets: dict[str, tuple[int, int]] = {}
        horizon = max((j.arrival for j in jobs), default=0.0)
        self.recorder.start(horizon)
        for seq, trace in enumerate(jobs):
            self._push(trace.arrival, ARRIVE, trace.id, 0)
            self.jobs[trace.id] = self._job(trace, seq)

    # -- jobs ---------------------------------------------------------------------------

    def _job(self, trace: TraceJob, seq: int) -> SimJob:
        if trace.model is None:
            return SimJob(trace, seq, None, work=trace.duration, elastic=False)
        profile = named_profile(trace.model)
        return SimJob(trace, seq, profile, work=float(profile.samples), elastic=self.cfg.policy in ELASTIC)

    def _pending(self, job: SimJob, gpus: int) -> PendingJob:
        tenant = "default" if self.cfg.policy == "fifo" else job.tenant
        return PendingJob(id=job.id, priority=0, seq=job.seq, gpus=gpus, tenant=tenant)

    def _elastic(self, job: SimJob) -> ElasticJob:
        assert job.profile is not None
        fixed = self.cfg.policy == "elastic-fixed-batch"
        lo, hi = (
            (job.trace.batch, job.trace.batch) if fixed else (job.profile.min_batch, job.profile.max_batch)
        )
        most = min(self.cfg.max_gpus or job.profile.max_gpus, self.cfg.gpus)
        batch = job.batch or (job.trace.batch if fixed else 0)
        profile = job.profile
        if self.cfg.learn:
            declared = _largest_local(job.profile) if self.cfg.learn_max_local else None
            profile = LearnedProfile(name="learn", min_batch=lo, max_batch=hi, least=self.cfg.min_gpus,
                                     max_local=declared, observed=job.observed)  # fmt: skip
        return ElasticJob(
            id=job.id, tenant=job.tenant, min_gpus=self.cfg.min_gpus, max_gpus=most, min_batch=lo,
            max_batch=hi, profile=profile, gpus=job.gpus, batch=batch, fixed_batch=fixed,
            changed_at=job.changed_at, accumulate=fixed and self.cfg.accumulate,
            remaining=max(job.work - job.done, 0.0),
        )  # fmt: skip

    def _rate(self, job: SimJob) -> float:
        if job.profile is None:
            return 1.0
        gpn = self.per_node
        if job.elastic:
            accumulate = self.cfg.policy == "elastic-fixed-batch" and self.cfg.accumulate
            return job.profile.throughput(job.gpus, job.batch, gpn, accumulate)
        # a rigid job runs as asked; Pollux's workloads assume gradient accumulation where the
        # per-GPU batch does not fit (bert at 384 on 12 GPUs)
        rate = job.profile.throughput(job.gpus, job.batch, gpn, accumulate=True)
        if rate <= 0:  # outside what was measured: the best batch in range on those GPUs
            self.fallbacks += 1
            rate = job.profile.best(job.gpus, gpus_per_node=gpn, accumulate=True)[0]
        return rate

    # -- nodes --------------------------------------------------------------------------

    def views(self) -> list[NodeView]:
        out = []
        for name in self.node_names:
            view = self._views.get(name)
            if view is None:
                gpus = tuple(
                    GpuSlot(f"{name}/{i}", i, "sim", 80 * GiB, free=not holder, holder=holder)
                    for i, holder in enumerate(self.holders[name])
                )  # fmt: skip
                view = self._views[name] = NodeView(name, True, gpus=gpus)
            out.append(view)
        return out

    def _take(self, job: SimJob, members: list[Placement]) -> None:
        for p in members:
            self.held[job.tenant] += len(p.gpus)
            slots = self.holders[p.node]
            for uuid in p.gpus:
                slots[int(uuid.rsplit("/", 1)[1])] = job.id
            self._views.pop(p.node, None)
        job.members = members

    def _release(self, job: SimJob) -> None:
        for p in job.members:
            self.held[job.tenant] -= len(p.gpus)
            slots = self.holders[p.node]
            for uuid in p.gpus:
                slots[int(uuid.rsplit("/", 1)[1])] = ""
            self._views.pop(p.node, None)
        job.members = []

    def free_gpus(self) -> int:
        return self.cfg.gpus - sum(self.held.values())

    # -- events -------------------------------------------------------------------------

    def _push(self, at: float, kind: int, job_id: str, version: int) -> None:
        self._tick += 1
        heapq.heappush(self.events, (at, kind, self._tick, job_id, version))

    def run(self) -> SimResult:
        until = self.cfg.until if self.cfg.until is not None else math.inf
        while self.events and self.events[0][0] <= until and self.unfinished:
            now = self.events[0][0]
            self._advance(now)
            changed = False
            while self.events and self.events[0][0] <= now:
                _, kind, _, job_id, version = heapq.heappop(self.events)
                changed |= self._event(kind, self.jobs[job_id], version)
            if changed:
                self._pass()
        if math.isfinite(until):
            self._advance(max(until, self.now))
        return self.recorder.result(self.cfg, list(self.jobs.values()), self.now, self.fallbacks)

    def _advance(self, now: float) -> None:
        """Fold the time since the last event into usage and the records."""
        held = self.held
        dt = now - self.now
        if dt > 0:
            self.recorder.span(self.now, now, held, len(self.queue) + len(self.waiting))
            if any(gpus > 0 for gpus in self.queued_gpus.values()):  # contended: compare with fair share
                demand = {t: held[t] + self.queued_gpus[t] for t in set(held) | set(self.queued_gpus)}
                self.recorder.contended(dt, held, fair_gpus(self.cfg.gpus, demand, self._policy))
            if self.cfg.policy == "fair":
                self.usage = accrue(self.usage, dict(held), dt, self.cfg.half_life_s)
        self.now = max(self.now, now)

    def _event(self, kind: int, job: SimJob, version: int) -> bool:
        """Apply one event; False when it is stale (a finish or wake-up of a job since changed)."""
        if kind == ARRIVE:
            if job.elastic:
                self.waiting[job.id] = job
            else:
                self.queue.add(self._pending(job, job.trace.gpus))
                self.queued_gpus[job.tenant] += job.trace.gpus
            return True
        if version != job.version or job.id not in self.running:
            return False
        if kind == FINISH:
            job.advance(self.now)
            self._end(job)
        return True

    def _end(self, job: SimJob) -> None:
        self._release(job)
        del self.running[job.id]
        job.ended, job.done, job.rate, job.gpus = self.now, job.work, 0.0, 0
        self.unfinished -= 1

    # -- a pass -------------------------------------------------------------------------

    def _pass(self) -> None:
        if self.cfg.policy in ELASTIC:
            self._resize()
        if not len(self.queue) or (not self.free_gpus() and not self._guarantees()):
            return  # nothing could be placed (the controller's pass would place nothing)
        fair = self._fair()
        plan = self.queue.schedule(Capacity(self.views()), self.now, fair=fair)
        self._start(plan.placements)
        if plan.blocked and self._guarantees():
            self._preempt(plan.blocked)

    def _fair(self) -> FairShare:
        if self.cfg.policy == "fifo":
            held = {"default": Use(gpus=sum(self.held.values()))}
        else:
            held = {tenant: Use(gpus=gpus) for tenant, gpus in self.held.items() if gpus}
        policies = {} if self.cfg.policy == "fifo" else self.cfg.tenants
        return FairShare(policies, held, self.usage, Use(gpus=self.cfg.gpus), self.cfg.half_life_s)

    def _policy(self, tenant: str) -> Tenant:
        return self.cfg.tenants.get(tenant) or Tenant(name=tenant)

    def _guarantees(self) -> bool:
        return self.cfg.policy == "fair" and any(t.guaranteed_gpus for t in self.cfg.tenants.values())

    def _start(self, placements: list[Placement]) -> None:
        grouped: dict[str, list[Placement]] = {}
        for p in placements:
            grouped.setdefault(p.job_id, []).append(p)
        for job_id, members in grouped.items():
            job = self.jobs[job_id]
            self.waiting.pop(job_id, None)
            if not job.elastic:
                self.queued_gpus[job.tenant] -= job.trace.gpus
            gpus = sum(len(p.gpus) for p in members)
            job.gpus = gpus
            job.batch = self._targets.get(job_id, (gpus, job.batch))[1] if job.elastic else job.trace.batch
            self._take(job, members)
            self.running[job_id] = job
            if job.started is None:
                job.started = self.now
            job.running_since = job.changed_at = self.now
            job.advance(self.now)
            job.paused_until = self.now + (self.cfg.resize_cost_s if job.restarting else 0.0)
            self._rerate(job)

    def _rerate(self, job: SimJob) -> None:
        job.rate = self._rate(job)
        if self.cfg.learn and job.elastic and job.rate > 0:
            job.observed[job.gpus, job.batch] = job.rate
        job.version += 1
        at = job.finish_at(self.now)
        if math.isfinite(at):
            self._push(at, FINISH, job.id, job.version)
        if job.elastic:
            self._push(self.now + self.cfg.min_interval_s, WAKE, job.id, job.version)

    # -- elastic ------------------------------------------------------------------------

    def _resize(self) -> None:
        """The elastic policy's decision, applied: stops, shrinks, then grows; admitted jobs enter
        the queue at their size (the pass that follows places them)."""
        elastic = sorted(
            [j for j in self.running.values() if j.elastic] + list(self.waiting.values()), key=lambda j: j.seq
        )  # fmt: skip
        if not elastic:
            return
        rigid_held = sum(j.gpus for j in self.running.values() if not j.elastic)
        rigid_waiting = sum(p.gpus for p in self.queue.jobs.values() if p.id not in self.waiting)
        budget = max(self.cfg.gpus - rigid_held - rigid_waiting, 0)
        for job in elastic:
            job.advance(self.now)
        self._targets = targets = allocate(
            [self._elastic(j) for j in elastic], budget, self.now, resize_cost_s=self.cfg.resize_cost_s,
            min_interval_s=self.cfg.min_interval_s, gpus_per_node=self.per_node, objective=self.cfg.objective,
            horizon_s=self.cfg.horizon_s,
        )  # fmt: skip
        running = [j for j in elastic if j.id in self.running]
        for job in running:
            if targets[job.id][0] == 0:
                self._stop(job)
        moving = [j for j in running if j.id in self.running and targets[j.id] != (j.gpus, j.batch)]
        self._move(moving, targets)
        for job in self.waiting.values():
            gpus, _ = targets.get(job.id, (0, 0))
            if gpus:
                self.queue.add(self._pending(job, gpus))
            else:
                self.queue.discard(job.id)

    def _stop(self, job: SimJob) -> None:
        self._release(job)
        del self.running[job.id]
        job.gpus, job.rate, job.version = 0, 0.0, job.version + 1
        job.preemptions += 1
        job.restarting = True
        self.waiting[job.id] = job

    def _move(self, jobs: list[SimJob], targets: Mapping[str, tuple[int, int]]) -> None:
        """Resize ``jobs``: each restarts anyway, so all of them give back their GPUs and are
        placed again, the largest first (best fit, gangs on whole nodes); where the GPUs free are
        not in the shape one needs, it takes the largest of its sizes that places (the policy is
        asked again after the minimum interval)."""
        old = {job.id: (job.gpus, job.batch, job.members) for job in jobs}
        for job in jobs:
            self._release(job)
        capacity = Capacity(self.views())
        for job in sorted(jobs, key=lambda j: (-targets[j.id][0], j.seq)):
            gpus, batch = targets[job.id]
            placed = capacity.place(PendingJob(job.id, 0, job.seq, gpus))
            if placed is None:
                self.misfits += 1
                self._push(self.now + self.cfg.min_interval_s, WAKE, job.id, job.version + 1)
                for g, b, _ in reversed(sizes(self._elastic(job), self.per_node)):
                    if g < gpus and (placed := capacity.place(PendingJob(job.id, 0, job.seq, g))):
                        gpus, batch = g, b
                        break
            if placed is None:  # not even one GPU: it waits to be admitted again
                self.running[job.id] = job
                self._stop(job)
                continue
            self._take(job, placed)
            if (gpus, batch) == old[job.id][:2]:
                self.moves += 1  # back at its size (maybe on other GPUs: a move, not counted as a resize)
                continue
            job.gpus, job.batch = gpus, batch
            job.changed_at = self.now
            job.paused_until = max(job.paused_until, self.now) + self.cfg.resize_cost_s
            job.resizes += 1
            self._rerate(job)

    # -- preemption (fair share with guarantees) ------------------------------------------

    def _preempt(self, blocked: list[str]) -> None:
        waiting = [self.queue.jobs[j] for j in blocked if j in self.queue.jobs][:16]
        running = [
            RunningJob(j.id, 1, j.tenant, 0, j.gpus, tuple((p.node, p.gpus) for p in j.members),
                       started_at=j.running_since)
            for j in self.running.values()
        ]  # fmt: skip
        fair = self._fair()
        demand = Counter({t: u.gpus for t, u in fair.held.items()})
        demand.update(self.queue.demand)
        found = preemptions(waiting, running, self.views(), fair, demand, self.now)
        held: dict[str, set[str]] = {}
        for p in found:
            for victim in p.victims:
                job = self.jobs[victim.id]
                job.advance(self.now)
                self._release(job)
                del self.running[job.id]
                job.gpus, job.rate, job.version = 0, 0.0, job.version + 1
                job.preemptions += 1
                job.restarting = True
                self.queue.add(self._pending(job, job.trace.gpus))
                self.queued_gpus[job.tenant] += job.trace.gpus
            held[p.job.id] = set(p.gpus)
        if held:
            plan = self.queue.schedule(Capacity(self.views()), self.now, fair=self._fair(), held=held)
            self._start(plan.placements)


def simulate(jobs: Sequence[TraceJob], config: SimConfig) -> SimResult:
    return Simulation(jobs, config).run()


def _largest_local(profile: Profile) -> int:
    """The largest per-GPU batch a model fits on one GPU: what a user would declare."""
    one = profile.placements.get((1,))
    measured = int(one[0][-1]) if one else profile.min_batch
    return min(measured, profile.max_local) if profile.max_local is not None else measured
