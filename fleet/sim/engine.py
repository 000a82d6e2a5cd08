"""The simulator: a trace on a virtual clock, scheduled by the controller's own pass.

Every pass is :func:`~fleet.scheduler.passes.run_pass` over simulated nodes instead of Redis: the elastic
step (``resizing.decide``, each tenant's ``max_gpus`` respected) sizes waiting elastic jobs and resizes
running ones; :class:`~fleet.scheduler.queue.PendingQueue` places waiting jobs on the nodes' GPUs (gangs
span nodes, large jobs reserve nodes) in the order :class:`~fleet.scheduler.fairshare.FairShare` gives
(tenants' weights, guarantees and limits, decayed usage folded by :func:`~fleet.scheduler.usage.accrue`);
:func:`~fleet.scheduler.preempt.preemptions` stops jobs for tenants below their guarantee, and the GPUs
they free are held for the job they were stopped for. This module only carries the plan out.

Time moves from event to event (arrivals, completions, a resized job's minimum interval ending, a
job's next epoch under the goodput model), and a pass runs after each instant's events. A job the
plan stops (a resize: the controller stops it and its agent requeues it at the new size; a
preemption) gives its GPUs back at once and is queued again; the pass then runs again at the same
instant, as the controller's does on the exits. A job's progress is piecewise linear: samples/s
from its profile at its size and batch (a workload job), under the goodput model counted at their
efficiency at that batch in the epoch it is in (``fleet.sim.model.worth``), or 1 s/s (a Philly job).
A restart after a resize or a preemption stops progress for ``resize_cost_s``; it keeps its progress.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence

from fleet.models import Tenant
from fleet.scheduler.fairshare import fair_gpus
from fleet.scheduler.learned import LearnedProfile
from fleet.scheduler.passes import HOLD_SLACK_S, Hold, PassInput, PassSettings, run_pass
from fleet.scheduler.preempt import Preemption, RunningJob
from fleet.scheduler.profiles import named_profile
from fleet.scheduler.queue import PendingQueue
from fleet.scheduler.resizing import Elastic, Resize
from fleet.scheduler.sizing import Size
from fleet.scheduler.snapshot import UNSIZED, GpuSlot, NodeView, PendingJob, Placement
from fleet.scheduler.usage import accrue
from fleet.sim.metrics import Recorder, SimResult
from fleet.sim.model import ELASTIC, SimConfig, SimJob, largest_local, noise_scale, speed, worth
from fleet.sim.traces import TraceJob

GiB = 1 << 30
ARRIVE, FINISH, WAKE, EPOCH = 0, 1, 2, 3
#: passes run at one instant at most (each after the last one stopped jobs: their GPUs are free)
PASSES_PER_INSTANT = 4


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
        self.running: dict[str, SimJob] = {}
        #: the elastic jobs that arrived and have not ended (waiting or running)
        self.elastic: dict[str, SimJob] = {}
        #: the running jobs as the pass sees them (kept along, not built again each pass)
        self.running_jobs: dict[str, RunningJob] = {}
        #: the tenants' policies (weights, guarantees, limits) as the pass sees them: none under fifo
        self.policies: Mapping[str, Tenant] = {} if config.policy == "fifo" else config.tenants
        guarantees = any(t.guaranteed_gpus for t in self.policies.values())
        #: preemption as live, left off when no tenant has a guarantee (all trace jobs share a priority)
        self.settings = PassSettings(
            preemption=guarantees,
            resize_cost_s=config.resize_cost_s,
            min_interval_s=config.min_interval_s,
            half_life_s=config.half_life_s,
            objective=config.objective,
            horizon_s=config.horizon_s,
            service_s=config.service_s,
        )
        self.holds: dict[str, Hold] = {}
        self._blocked: list[str] = []
        #: what the passes decided, and jobs' ends, in order: (time, "placed" | "resized" | "preempted" |
        #: "ended", job, GPUs placed at or resized to)
        self.decisions: list[tuple[float, str, str, int]] = []
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

    def _tenant(self, job: SimJob) -> str:
        return "default" if self.cfg.policy == "fifo" else job.tenant

    def _pending(self, job: SimJob, gpus: int) -> PendingJob:
        hold, tenant = UNSIZED if job.elastic and not gpus else "", self._tenant(job)
        return PendingJob(job.id, 0, job.seq, gpus, tenant=tenant, elastic=job.elastic, hold=hold)

    def _elastic(self, job: SimJob) -> Elastic:
        """``job`` as the elastic step sees it (as ``Elastic.of`` a stored job, live)."""
        assert job.profile is not None
        fixed = self.cfg.policy == "elastic-fixed-batch"
        lo, hi = (
            (job.trace.batch, job.trace.batch) if fixed else (job.profile.min_batch, job.profile.max_batch)
        )
        most = min(self.cfg.max_gpus or job.profile.max_gpus, self.cfg.gpus)
        profile = job.profile
        if self.cfg.learn:
            declared = largest_local(job.profile) if self.cfg.learn_max_local else None
            profile = LearnedProfile(
                name="learn",
                min_batch=lo,
                max_batch=hi,
                least=self.cfg.min_gpus,
                max_local=declared,
                observed=job.observed,
            )
        running = job.id in self.running
        gpus = job.gpus if running else self.queue.jobs[job.id].gpus
        return Elastic(
            id=job.id,
            tenant=self._tenant(job),
            min_gpus=self.cfg.min_gpus,
            max_gpus=most,
            min_batch=lo,
            max_batch=hi,
            profile=profile,
            size=Size(gpus, job.batch if gpus else 0),
            running=running,
            changed_at=job.changed_at,
            fixed_batch=fixed,
            remaining=max(job.work - job.done, 0.0),
            accumulate=fixed and self.cfg.accumulate,
            noise_scale=noise_scale(self.cfg, job),
            attained=job.attained,
            arrived_at=job.trace.arrival,
            restarts=job.resizes,
            follows_batch=running and job.elastic,
        )

    # -- nodes --------------------------------------------------------------------------

    def views(self) -> list[NodeView]:
        out = []
        for name in self.node_names:
            view = self._views.get(name)
            if view is None:
                gpus = tuple(
                    GpuSlot(f"{name}/{i}", i, "sim", 80 * GiB, free=not holder, holder=holder)
                    for i, holder in enumerate(self.holders[name])
                )
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
            self.recorder.span(self.now, now, held, len(self.queue))
            if any(gpus > 0 for gpus in self.queued_gpus.values()):  # contended: compare with fair share
                demand = {t: held[t] + self.queued_gpus[t] for t in set(held) | set(self.queued_gpus)}
                self.recorder.contended(dt, held, fair_gpus(self.cfg.gpus, demand, self._policy))
            if self.cfg.policy != "fifo":  # as live: every tenant's use decays into its fair share
                self.usage = accrue(self.usage, dict(held), dt, self.cfg.half_life_s)
        self.now = max(self.now, now)

    def _event(self, kind: int, job: SimJob, version: int) -> bool:
        """Apply one event; False when it is stale (a finish or wake-up of a job since changed)."""
        if kind == ARRIVE:
            self.queue.add(self._pending(job, 0 if job.elastic else job.trace.gpus))
            if job.elastic:
                self.elastic[job.id] = job
            else:
                self.queued_gpus[job.tenant] += job.trace.gpus
            return True
        if version != job.version or job.id not in self.running:
            return False
        if kind == FINISH:
            job.advance(self.now)
            self._end(job)
        if kind == EPOCH:  # a new noise scale: other progress, and maybe (past its interval) a new size
            job.advance(self.now)
            self._rerate(job)
            return job.elastic and self.now >= job.changed_at + self.cfg.min_interval_s
        return True

    def _end(self, job: SimJob) -> None:
        self._release(job)
        del self.running[job.id]
        del self.running_jobs[job.id]
        self.elastic.pop(job.id, None)
        self.decisions.append((self.now, "ended", job.id, 0))
        job.ended, job.done, job.rate, job.gpus = self.now, job.work, 0.0, 0
        self.unfinished -= 1

    # -- a pass -------------------------------------------------------------------------

    def _pass(self) -> None:
        """Passes until nothing is stopped (a stopped job's GPUs are free at once: as the controller
        runs a pass on the exits, this runs the next one at the same instant)."""
        for _ in range(PASSES_PER_INSTANT):
            if not self._one_pass():
                return

    def _one_pass(self) -> bool:
        elastic = sorted(self.elastic.values(), key=lambda j: (j.id not in self.running, j.seq))
        place = bool(len(self.queue)) and (self.free_gpus() > 0 or self.settings.preemption)
        if not elastic and not place:
            return False  # nothing could be placed (the controller's pass would place nothing)
        for job in elastic:
            job.advance(self.now)
        inp = PassInput(
            self.queue,
            self.views(),
            self.policies,
            self.running_jobs,
            self.usage,
            self.holds,
            self.settings,
            elastic=[self._elastic(j) for j in elastic],
            resize=bool(elastic),
            place=place,
            blocked=self._blocked,
        )
        plan = run_pass(inp, self.now)
        self.holds, self._blocked = plan.holds, plan.blocked
        stopped = False
        for change in plan.resizes:
            stopped |= self._resize(change)
        self._start(plan.placements)
        for preemption in plan.preemptions:
            self._preempt(preemption)
            stopped = True
        return stopped

    def _start(self, placements: list[Placement]) -> None:
        grouped: dict[str, list[Placement]] = {}
        for p in placements:
            grouped.setdefault(p.job_id, []).append(p)
        for job_id, members in grouped.items():
            job = self.jobs[job_id]
            if not job.elastic:
                self.queued_gpus[job.tenant] -= job.trace.gpus
            gpus = sum(len(p.gpus) for p in members)
            job.gpus = gpus
            if not job.elastic:
                job.batch = job.trace.batch
            self._take(job, members)
            self.running[job_id] = job
            self.running_jobs[job_id] = RunningJob(
                job_id,
                1,
                self._tenant(job),
                0,
                gpus,
                tuple((p.node, p.gpus) for p in members),
                started_at=self.now,
            )
            self.decisions.append((self.now, "placed", job_id, gpus))
            if job.started is None:
                job.started = self.now
            job.running_since = job.changed_at = self.now
            job.advance(self.now)
            job.paused_until = self.now + (self.cfg.resize_cost_s if job.restarting else 0.0)
            self._rerate(job)

    def _rerate(self, job: SimJob) -> None:
        samples, fell_back = speed(self.cfg, job, self.per_node)
        self.fallbacks += fell_back
        job.rate = samples * worth(self.cfg, job)  # samples/s at their efficiency
        if self.cfg.learn and job.elastic and job.rate > 0:
            job.observed[job.gpus, job.batch] = samples
        job.version += 1
        at = job.finish_at(self.now)
        if math.isfinite(at):
            self._push(at, FINISH, job.id, job.version)
        epoch = job.next_epoch_at(self.now) if noise_scale(self.cfg, job) is not None else math.inf
        if math.isfinite(epoch):
            self._push(epoch, EPOCH, job.id, job.version)
        wake = job.changed_at + self.cfg.min_interval_s  # its minimum interval ends: a pass
        if job.elastic and wake > self.now:
            self._push(wake, WAKE, job.id, job.version)

    def _stop(self, job: SimJob, gpus: int) -> None:
        """``job`` leaves its GPUs (at once: its checkpoint is its restart's cost) and waits again for
        ``gpus`` GPUs (an elastic job: 0, its size not chosen yet)."""
        job.advance(self.now)
        self._release(job)
        del self.running[job.id]
        del self.running_jobs[job.id]
        job.gpus, job.rate, job.version = 0, 0.0, job.version + 1
        job.restarting = True
        self.queue.add(self._pending(job, gpus))
        if not job.elastic:
            self.queued_gpus[job.tenant] += gpus

    def _resize(self, change: Resize) -> bool:
        """A waiting job was sized (the pass placed it, or it waits at that size); a running one
        restarts at its new size (it is stopped, and queued at it), or takes a new batch up where it
        runs (``in_place``: every elastic job here follows, as with ``fw.batch_size(follow=True)``).
        True when a job was stopped."""
        job = self.jobs[change.job_id]
        if change.in_place:
            job.advance(self.now)
            job.batch = change.new.batch
            self._rerate(job)
            return False
        job.batch = change.new.batch
        if not change.running:
            return False
        self.decisions.append((self.now, "resized", job.id, change.new.gpus))
        if change.new.gpus:
            job.resizes += 1
        else:
            job.preemptions += 1  # even its smallest size no longer fits: it waits to be admitted again
        job.changed_at = self.now
        self._stop(job, change.new.gpus)
        return True

    def _preempt(self, preemption: Preemption) -> None:
        """All the victims or none (as the controller's applier: each must still be running)."""
        if not all(v.id in self.running for v in preemption.victims):
            return
        for victim in preemption.victims:
            job = self.jobs[victim.id]
            self.decisions.append((self.now, "preempted", job.id, job.gpus))
            job.preemptions += 1
            self._stop(job, job.gpus if job.elastic else job.trace.gpus)
        grace = max(self._policy(v.tenant).preempt_grace_s for v in preemption.victims)
        self.holds[preemption.job.id] = Hold(
            preemption.gpus, frozenset(v.id for v in preemption.victims), self.now + grace + HOLD_SLACK_S
        )

    def _policy(self, tenant: str) -> Tenant:
        """The tenant's configured policy (what fair share would give it, under any policy)."""
        return self.cfg.tenants.get(tenant) or Tenant(name=tenant)


def simulate(jobs: Sequence[TraceJob], config: SimConfig) -> SimResult:
    return Simulation(jobs, config).run()
