"""The leader's view of tenants: policies, what each tenant's jobs hold, decayed usage, and the GPUs
held for jobs that preempted others. The decisions are the pass's (``fleet.scheduler.passes``);
this keeps their inputs up to date between passes without scanning the jobs.

What runs is learnt from the jobs the controller reads anyway: those it places, those messages
name (started, exited), and every job on a node at each full reconcile (``resync_interval_s``),
which mends anything missed. Holds live in memory; a new leader rebuilds them from the victims'
``preempted_for`` while they are still stopping, so a failover neither forgets nor repeats one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from fleet.config_sections import ControllerSettings
from fleet.controller import snapshot
from fleet.models import Job, JobState, Tenant, TenantStatus
from fleet.scheduler import (
    FairShare,
    NodeView,
    PendingJob,
    PendingQueue,
    Placement,
    Preemption,
    RunningJob,
    Use,
    fleet_size,
)
from fleet.scheduler.passes import HOLD_SLACK_S, Hold
from fleet.scheduler.passes import holdings as held_by
from fleet.state.tenants import TenantStore


class Tenancy:
    def __init__(self, store: TenantStore, cfg: ControllerSettings) -> None:
        self.store, self.cfg = store, cfg
        self.policies: dict[str, Tenant] = {}
        self.usage: dict[str, float] = {}
        self.running: dict[str, RunningJob] = {}
        self.holds: dict[str, Hold] = {}

    # -- what runs --------------------------------------------------------------------

    def observe(self, jobs: Iterable[Job]) -> None:
        """Jobs just read: those on nodes are running (or being started), the others left."""
        for job in jobs:
            if job.state.on_node:
                self.running[job.id] = running_job(job)
            else:
                self.running.pop(job.id, None)

    def resync(self, on_nodes: Iterable[Job], now: float) -> None:
        """Every job on a node, as just read: the truth replaces what was learnt piecemeal, and holds
        lost with a previous leader come back from their victims."""
        self.running = {}
        self.observe(on_nodes)
        for r in self.running.values():
            if r.stopping and r.preempted_for and r.preempted_for not in self.holds:
                self.holds[r.preempted_for] = Hold(frozenset(), frozenset(), now + HOLD_SLACK_S)
            hold = self.holds.get(r.preempted_for) if r.preempted_for else None
            if hold is not None:
                self.holds[r.preempted_for] = replace(
                    hold, gpus=hold.gpus | r.uuids, victims=hold.victims | {r.id}
                )

    def placed(self, job: PendingJob, members: list[Placement], attempt: int) -> None:
        where = tuple((p.node, p.gpus) for p in members)
        self.running[job.id] = RunningJob(
            job.id, attempt, job.tenant, job.priority, job.gpus, where, job.cpus, job.memory
        )

    def holdings(self) -> dict[str, Use]:
        return held_by(self.running.values())

    def fair(self, views: Iterable[NodeView]) -> FairShare:
        """A pass's fair-share state (a fresh one: the pass adds its placements to it)."""
        return FairShare(
            self.policies, self.holdings(), self.usage, fleet_size(views), self.cfg.fair_share_half_life_s
        )

    # -- preemption -------------------------------------------------------------------

    def hold(self, preemption: Preemption, stopped: list[RunningJob], now: float) -> None:
        grace = max((self.policy(v.tenant).preempt_grace_s for v in stopped), default=0.0)
        gpus = frozenset(u for v in stopped for u in v.uuids)
        self.holds[preemption.job.id] = Hold(
            gpus, frozenset(v.id for v in stopped), now + grace + HOLD_SLACK_S
        )
        for v in stopped:
            self.running[v.id] = replace(v, stopping=True, preempted_for=preemption.job.id)

    def policy(self, tenant: str) -> Tenant:
        return self.policies.get(tenant) or Tenant(name=tenant)

    # -- policies, usage, status ---------------------------------------------------------

    def refresh(self, queue: PendingQueue, views: list[NodeView], now: float, leader: str) -> bool:
        """Re-read the policies, fold what runs into the usage and publish every tenant's status;
        True when a policy changed (a pass should run)."""
        policies = {t.name: t for t in self.store.all()}
        changed, self.policies = policies != self.policies, policies
        held = self.holdings()
        status = self.status(held, queue, views)
        usage = self.store.fold(
            {t: u.gpus for t, u in held.items()}, now, self.cfg.fair_share_half_life_s, leader, status
        )
        self.usage = usage.gpu_seconds
        return changed

    def status(
        self, held: Mapping[str, Use], queue: PendingQueue, views: list[NodeView]
    ) -> list[TenantStatus]:
        fair = self.fair(views)
        demand = Counter({t: u.gpus for t, u in held.items()})
        demand.update(queue.demand)
        shares = fair.fair_gpus(demand)
        names = set(self.policies) | set(held) | set(queue.counts)
        return [
            TenantStatus(
                tenant=self.policy(t),
                configured=t in self.policies,
                gpus_used=held.get(t, Use()).gpus,
                jobs_running=held.get(t, Use()).jobs,
                jobs_pending=queue.counts.get(t, 0),
                fair_share_gpus=round(shares.get(t, 0.0), 3),
            )
            for t in sorted(names)
        ]


def running_job(job: Job) -> RunningJob:
    """``job`` (on a node) as preemption sees it."""
    members = tuple((m.node, tuple(m.gpus)) for m in job.members)
    if not members and job.node:
        members = ((job.node, tuple(job.gpus)),)
    asks = snapshot.pending(job)
    started = job.started_at if job.state == JobState.RUNNING else None
    return RunningJob(
        job.id,
        job.attempt,
        job.spec.tenant,
        job.spec.priority,
        job.gpu_count,
        members,
        asks.cpus,
        asks.memory,
        started_at=started,
        preemptible=job.spec.preemptible,
        stopping=bool(job.preempt or job.cancel_requested),
        preempted_for=job.preempted_for,
    )
