"""The controller carries a pass's plan out (``fleet.scheduler.passes.run_pass``): fenced writes first,
then the messages that act on them.

In the plan's order: resizes (a queued elastic job's size is written before it is placed; a running
one is asked to leave and stopped, and its agent requeues it at the new size; one whose batch alone
changes and that follows that in place has its batch written and its agents told), placements (one
``place_many``, then a Launch to each member's node) and waiting reasons, preemptions (all the
victims or none: each read again, asked to leave and stopped; the GPUs they free are held for the
job they are for). Every write is fenced by the leader token: a refused one raises ``NotLeader`` and
the controller steps down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fleet.bus import Bus, Launch, node_queue, rebatch_attempt, stop_attempt
from fleet.config_sections import ControllerSettings
from fleet.controller.elasticity import Elasticity
from fleet.controller.tenancy import Tenancy
from fleet.controller.views import ViewCache
from fleet.log import event
from fleet.models import Job, JobState
from fleet.scheduler import Placement, Plan, Preemption, sizing
from fleet.scheduler.passes import PassPlan
from fleet.scheduler.resizing import Resize
from fleet.state import JobStore

log = logging.getLogger("fleet.controller")


class Applier:
    def __init__(
        self,
        jobs: JobStore,
        bus: Bus,
        views: ViewCache,
        tenancy: Tenancy,
        elasticity: Elasticity,
        cfg: ControllerSettings,
        token: Callable[[], str],
    ) -> None:
        self.jobs, self.bus, self.views, self.cfg, self.token = jobs, bus, views, cfg, token
        self.tenancy, self.elasticity = tenancy, elasticity

    def apply(self, plan: PassPlan, now: float) -> None:
        refused = {
            change.job_id for change in plan.resizes if not self._resize(change, now) and not change.running
        }
        self._place(plan.placed, now, refused)
        for preemption in plan.preemptions:
            self._preempt(preemption, now)

    # -- resizes -----------------------------------------------------------------------

    def _resize(self, change: Resize, now: float) -> bool:
        """A queued job gets its size; a running one SIGTERM with its tenant's grace to checkpoint, and
        its agent requeues it at the new size. False when the job moved on meanwhile."""
        job, new = self.elasticity.jobs[change.job_id], change.new
        if change.in_place:
            return self._rebatch(job, change, now)
        what = f"resized {sizing.change(change.old, new)}" if change.old.gpus else f"sized {new}"
        reason = f"{what} by the elastic step"
        grace = self.tenancy.policy(job.spec.tenant).preempt_grace_s
        if not self.jobs.resize(job, new.gpus, new.batch, reason, grace, now, self.token()):
            self.views.touch(jobs=[job.id])  # read it again
            return False
        job = self.elasticity.resized(job, change, now)
        event(
            log,
            "job_resized",
            job=job.id,
            attempt=job.attempt,
            old=str(change.old),
            new=str(new),
            running=change.running,
        )
        if change.running:
            stop_attempt(self.bus, job.id, job.attempt, job.nodes_held, reason, grace)
        return True

    def _rebatch(self, job: Job, change: Resize, now: float) -> bool:
        """A running job that follows a batch change in place takes up its new batch where it runs:
        its record says it, and its agents tell the attempt (``fleet.bus.rebatch_attempt``)."""
        reason = f"batch {change.old.batch} -> {change.new.batch} in place by the elastic step"
        if not self.jobs.rebatch(job, change.new.batch, reason, now, self.token()):
            self.views.touch(jobs=[job.id])
            return False
        job = self.elasticity.resized(job, change, now)
        event(log, "job_rebatched", job=job.id, attempt=job.attempt, old=str(change.old), new=str(change.new))
        rebatch_attempt(self.bus, job.id, job.attempt, job.nodes_held, change.new.batch)
        return True

    # -- placements --------------------------------------------------------------------

    def _place(self, plan: Plan, now: float, refused: set[str]) -> None:
        jobs: dict[str, list[Placement]] = {}
        for p in plan.placements:  # a multi-node job has one placement per member, rank 0 first
            jobs.setdefault(p.job_id, []).append(p)
        if refused & jobs.keys():  # its size was not written: it is read again, placed next pass
            jobs = {job_id: members for job_id, members in jobs.items() if job_id not in refused}
        batch = [self._entry(members, plan.jobs[job_id].rev) for job_id, members in jobs.items()]
        ports = (self.cfg.rendezvous_port_base, self.cfg.rendezvous_ports)
        attempts = self.jobs.place_many(batch, self.token(), now, ports) if batch else []
        for (job_id, members), attempt in zip(jobs.items(), attempts, strict=True):
            # their claims changed: read again; refused: see where the job stands now
            self.views.touch(jobs=[] if attempt else [job_id], nodes=[p.node for p in members])
            if attempt:
                self.views.placed(members, attempt)
                self.tenancy.placed(plan.jobs[job_id], members, attempt)
                self.elasticity.placed(job_id, attempt)
            for p in members if attempt else ():
                self.bus.send(node_queue(p.node), Launch(job_id=job_id, attempt=attempt, gpus=list(p.gpus)))
        if plan.waiting:
            self.jobs.set_reasons(plan.waiting, self.token(), now)

    def _entry(self, members: list[Placement], rev: int) -> dict[str, Any]:
        """One place_many entry: a job's one node, or every member of a multi-node job; ``rev``: the
        job's revision the pass read (a hold or update since refuses the placement)."""
        first = members[0]
        where = [f"{p.node}" + (f" GPUs {','.join(p.gpus)}" if p.gpus else "") for p in members]
        entry = {
            "job": first.job_id,
            "node": first.node,
            "gpus": list(first.gpus),
            "cpus": first.cpus,
            "memory": first.memory,
            "reason": "placed on " + "; ".join(where),
            "rev": rev,
        }
        if len(members) > 1:
            node = self.views.known.get(first.node)
            entry["master_addr"] = node.address if node and node.address else first.node
            entry["members"] = [
                {"node": p.node, "gpus": list(p.gpus), "cpus": p.cpus, "memory": p.memory} for p in members
            ]
        return entry

    # -- preemptions -------------------------------------------------------------------

    def _preempt(self, preemption: Preemption, now: float) -> None:
        """All the victims or none: each is read again first (it may have ended, or be younger than
        the snapshot said); then SIGTERM with its tenant's grace to checkpoint, and the agent
        requeues it without spending a retry, as for a drain."""
        batch = self.jobs.read_many([v.id for v in preemption.victims])
        current = {j.id: j for j in self.views.readable(batch, now)}
        self.tenancy.observe(current.values())
        if not all(self._still_victim(current.get(v.id), v.attempt, now) for v in preemption.victims):
            return
        stopped = []
        for victim in preemption.victims:
            job, reason = current[victim.id], preemption.reasons[victim.id]
            grace = self.tenancy.policy(victim.tenant).preempt_grace_s
            if not self.jobs.ask_to_leave(
                job,
                reason,
                grace,
                now,
                self.token(),
                allowed=[JobState.RUNNING],
                preempted_for=preemption.job.id,
            ):
                continue
            stop_attempt(self.bus, job.id, job.attempt, job.nodes_held, reason, grace)
            self.tenancy.store.count_preemption(victim.tenant)
            stopped.append(victim)
            event(
                log,
                "job_preempted",
                job=job.id,
                attempt=job.attempt,
                tenant=victim.tenant,
                grace_s=f"{grace:g}",
                reason=reason,
            )
        if stopped:
            self.tenancy.hold(preemption, stopped, now)

    def _still_victim(self, job: Job | None, attempt: int, now: float) -> bool:
        if job is None or job.attempt != attempt or job.state != JobState.RUNNING or job.started_at is None:
            return False
        ran = now - job.started_at
        return (
            not job.preempt
            and not job.cancel_requested
            and ran >= self.tenancy.policy(job.spec.tenant).min_run_s
        )
