"""The controller service: the only place that decides placement.

One controller holds the leader lease and runs a scheduling pass on every relevant message
(submit, exit, node joined) and periodically; the others wait to take over. The periodic
reconcile (``reconcile.py``, pure) sorts jobs on nodes, nodes and claims into buckets that this
service executes: requeue jobs of lost nodes and launches past their deadline (without spending
retries), stop drained jobs, mark nodes DRAINED, free orphan claims. Retention (``retention.py``,
pure) deletes jobs ``job_retention_s`` after they ended and nodes gone for ``node_retention_s``.
Every write is fenced by the leader token; a refused one makes this controller step down at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from fleet import metrics
from fleet.bus import (
    CONTROLLER_QUEUE,
    AttemptUpdate,
    Bus,
    JobSubmitted,
    Launch,
    NodeChanged,
    Stop,
    node_queue,
)
from fleet.config import Settings
from fleet.controller import retention, snapshot
from fleet.controller.leader import LeaderLease
from fleet.controller.reconcile import Buckets, DrainStop, Requeue, reconcile
from fleet.errors import FleetError, NotLeader
from fleet.lifecycle import RetryPolicy
from fleet.log import StepHealth, event
from fleet.models import ON_NODE_STATES, Job, JobState, Node, NodeState
from fleet.scheduler import Plan, schedule
from fleet.sdnotify import Notifier
from fleet.state import JobStore, NodeStore
from fleet.state.records import JobBatch, NodeBatch
from fleet.state.retention import RetentionStore

log = logging.getLogger("fleet.controller")
#: batches of ``retention_batch`` jobs one retention pass deletes at most (the rest: next pass)
RETENTION_BATCHES = 20


class Controller:
    def __init__(
        self,
        settings: Settings,
        jobs: JobStore,
        nodes: NodeStore,
        bus: Bus,
        clock: Callable[[], float] = time.time,
        controller_id: str | None = None,
    ) -> None:
        self.settings, self.cfg = settings, settings.controller
        self.jobs, self.nodes, self.bus, self.clock = jobs, nodes, bus, clock
        self.id = controller_id or uuid.uuid4().hex[:8]
        self.lease = LeaderLease(jobs.redis, jobs.keys, self.id, self.cfg.leader_lease_s)
        self.retention = RetentionStore(jobs.redis, jobs.keys)
        #: jobs that ended before fleet had retention are tracked once per leadership
        self._tracked = False
        self.policy = RetryPolicy(
            settings.retry_backoff_s, settings.retry_backoff_max_s, settings.max_infra_requeues
        )
        self.stop_event = threading.Event()
        self._health = StepHealth(log)
        self.notifier = Notifier()
        self._wake = threading.Event()
        self._worker: Any = None
        #: earliest end of a queued job's retry backoff: the loop wakes then instead of next interval
        self._due = float("inf")
        self.registry, self._pass_seconds = metrics.controller_registry(jobs, nodes)

    def run(self) -> None:
        event(log, "controller_start", id=self.id, redis=self.settings.redis_display)
        metrics.serve(self.registry, self.cfg.metrics_port, log)
        for schema in (JobSubmitted, AttemptUpdate, NodeChanged):
            self.bus.handle(CONTROLLER_QUEUE, schema, self.on_message)
        renew_every = self.cfg.leader_lease_s / 3
        periodic = [(self._lead, renew_every, False), (self.reconcile, self.cfg.schedule_interval_s, True),
                    (self.expire, self.cfg.retention_interval_s, True)]  # fmt: skip
        next_run = [0.0] * len(periodic)
        self.notifier.ready(f"controller {self.id}")
        try:
            while not self.stop_event.is_set():
                self.notifier.watchdog()
                for i, (step, every, leader_only) in enumerate(periodic):
                    if time.monotonic() >= next_run[i] and (self.lease.value or not leader_only):
                        self._guarded(step)
                        next_run[i] = time.monotonic() + every
                if self.lease.value:
                    self._guarded(self.schedule_pass)
                due_in = max(self._due - self.clock(), 0.0) if self.lease.value else float("inf")
                self._wake.wait(min(renew_every, self.cfg.schedule_interval_s, self.cfg.retention_interval_s,
                                    due_in))  # fmt: skip
                self._wake.clear()
        finally:
            self.notifier.stopping()
            self._follow()
            event(log, "controller_stop", id=self.id)

    def on_message(self, msg: Any) -> None:
        self._wake.set()

    def _lead(self) -> None:
        was = bool(self.lease.value)
        try:
            leading = self.lease.renew()
        except FleetError:
            self.lease.value = ""
            raise
        finally:
            if was and not self.lease.value:
                event(log, "leadership_lost", id=self.id)
                self._follow()
        if leading and not was:
            event(log, "leadership_acquired", id=self.id, lease=self.lease.value)
            self._tracked = False
            self._worker = self.bus.worker(CONTROLLER_QUEUE, self.cfg.worker_threads)

    def _token(self) -> str:
        """The leader value every controller write is fenced by ('' would mean "not fenced")."""
        if not self.lease.value:
            raise NotLeader(f"controller {self.id} does not hold the leader lease")
        return self.lease.value

    def _deposed(self) -> None:
        """A fenced write was refused: another controller took the lease. Stop leading at once
        rather than at the next renewal; the loop tries to acquire the lease again as a follower."""
        if self.lease.value:
            event(log, "leadership_lost", logging.WARNING, id=self.id, why="write fenced off")
        self.lease.value = ""
        self._follow()

    def _follow(self) -> None:
        if self._worker is not None:
            self._worker.stop(timeout=2000)
            self._worker = None

    def _guarded(self, step: Callable[[], object]) -> None:
        self._health.guard(step, id=self.id)

    # -- scheduling --------------------------------------------------------------------

    def schedule_pass(self) -> Plan:
        with self._pass_seconds.time():
            try:
                return self._schedule_pass()
            except NotLeader:
                self._deposed()
                return Plan()

    def _schedule_pass(self) -> Plan:
        now = self.clock()
        queued = self._readable(self.jobs.read_queued(), now)
        self._due = min((j.not_before for j in queued if j.not_before > now), default=float("inf"))
        if not queued:
            return Plan()
        plan = schedule(snapshot.build(queued, self._read_nodes().nodes, now), now)
        for p in plan.placements:
            reason = f"placed on {p.node}" + (f" GPUs {','.join(p.gpus)}" if p.gpus else "")
            attempt = self.jobs.place(p.job_id, p.node, list(p.gpus), self._token(), now, reason)
            if attempt:
                self.bus.send(node_queue(p.node), Launch(job_id=p.job_id, attempt=attempt, gpus=list(p.gpus)))
        reasons = {j.id: j.reason for j in queued}
        for job_id, why in plan.waiting.items():
            if reasons.get(job_id) != why:
                self.jobs.transition(
                    job_id, to=None, allowed=[JobState.QUEUED], reason=why, now=now, record=False,
                    leader=self._token(),
                )  # fmt: skip
        return plan

    # -- unreadable records ------------------------------------------------------------

    def _readable(self, batch: JobBatch, now: float) -> list[Job]:
        """The jobs that parsed; the others are quarantined (each logged once, by whoever leads)."""
        for job_id, reason in batch.corrupt.items():
            if self.jobs.quarantine(job_id, reason, now, self._token()):
                event(log, "record_quarantined", logging.WARNING, kind="job", id=job_id, reason=reason)
        return batch.jobs

    def _read_nodes(self) -> NodeBatch:
        """Nodes as stored; an unreadable record is left out of scheduling and quarantined (logged
        once), and forgotten from quarantine once it reads again (an agent rewrote it)."""
        batch = self.nodes.read_all()
        for name, reason in batch.corrupt.items():
            if self.nodes.quarantine(name, reason, self._token()):
                event(log, "record_quarantined", logging.WARNING, kind="node", id=name, reason=reason)
        for name in batch.quarantined.keys() - batch.corrupt.keys():
            if self.nodes.quarantine(name, "", self._token()):
                event(log, "record_recovered", kind="node", id=name)
        return batch

    # -- failure detection -------------------------------------------------------------

    def reconcile(self) -> Buckets:
        """Requeue lost and stuck jobs, move drains along, free orphan claims (see reconcile.py)."""
        try:
            return self._reconcile()
        except NotLeader:
            self._deposed()
            return Buckets()

    def _reconcile(self) -> Buckets:
        now = self.clock()
        nodes = self._read_nodes()
        jobs = self._readable(self.jobs.read_on_nodes(), now)
        # a node whose record cannot be read but whose agent holds its lease keeps its jobs
        unreadable = [Node(name=n, state=NodeState.READY, alive=True) for n in nodes.corrupt_alive]
        buckets = reconcile([*nodes.nodes, *unreadable], jobs, nodes.claims, now, self.cfg)
        for requeue in (*buckets.requeue_lost, *buckets.timeouts):
            self._requeue(requeue, now)
        for stop in buckets.drain_stops:
            self._drain_stop(stop, now)
        operators = {n.name: n.changed_by for n in nodes.nodes}
        for name in buckets.drained:
            if self.nodes.set_state(name, NodeState.DRAINED, "drained", now, operators.get(name, ""),
                                    leader=self._token(), only_from=[NodeState.DRAINING]):  # fmt: skip
                event(log, "node_drained", node=name)
        if buckets.orphan_claims and self.jobs.release_orphan_claims(buckets.orphan_claims, self._token()):
            event(log, "orphan_claims_released", logging.WARNING,
                  claims=",".join(f"{uuid}={holder}" for uuid, holder in buckets.orphan_claims))  # fmt: skip
        return buckets

    def _requeue(self, requeue: Requeue, now: float) -> None:
        """Requeue without spending retries, if the job is still where the snapshot saw it."""
        job, exit = requeue.job, requeue.exit
        decision = self.jobs.end_attempt(
            job, exit, self.policy, now, leader=self._token(), allowed=[job.state]
        )
        if decision is None:
            return
        event(log, "job_requeued", job=job.id, attempt=job.attempt, node=job.node, kind=exit.kind,
              state=decision.state, reason=exit.reason)  # fmt: skip
        if requeue.stop and job.node:
            grace = self.settings.agent.stop_grace_s
            stop = Stop(job_id=job.id, attempt=job.attempt, reason=exit.reason, grace_s=grace)
            self.bus.send(node_queue(job.node), stop)

    def _drain_stop(self, drain: DrainStop, now: float) -> None:
        """SIGTERM with a grace period to checkpoint; the agent requeues it without spending retries."""
        job = drain.job
        if self.jobs.transition(
            job.id, attempt=job.attempt, to=None, allowed=ON_NODE_STATES,
            reason=f"{drain.reason}: stopping with {drain.grace_s:g}s to checkpoint", now=now,
            fields={"preempt": drain.reason}, leader=self._token(),
        ) and job.node:  # fmt: skip
            stop = Stop(job_id=job.id, attempt=job.attempt, reason=drain.reason, grace_s=drain.grace_s)
            self.bus.send(node_queue(job.node), stop)

    # -- retention ---------------------------------------------------------------------

    def expire(self) -> int:
        """Delete ended jobs past ``job_retention_s`` and nodes gone for ``node_retention_s`` (see
        retention.py); the number of jobs deleted."""
        try:
            if not self._tracked:
                self._track_ended()
            deleted = self._expire_jobs()
            self._remove_gone_nodes()
            return deleted
        except NotLeader:
            self._deposed()
            return 0

    def _track_ended(self) -> None:
        added = self.retention.track_ended(self.clock(), self._token())
        if added:
            event(log, "ended_jobs_tracked", count=added, why="ended before fleet had retention")
        self._tracked = True

    def _expire_jobs(self) -> int:
        now, batch, keep = self.clock(), self.cfg.retention_batch, self.settings.job_retention_s
        deleted = 0
        for _ in range(RETENTION_BATCHES):
            due = retention.due_jobs(self.retention.oldest_ended(batch), now, keep)
            deleted += self.retention.expire_jobs(
                due, now - keep, now, self.settings.tombstone_retention_s, self._token()
            )
            if len(due) < batch:
                break
        if deleted:
            event(log, "jobs_expired", count=deleted, retention_s=f"{keep:g}")
        return deleted

    def _remove_gone_nodes(self) -> None:
        now, keep = self.clock(), self.settings.node_retention_s
        for name in retention.gone_nodes(self._read_nodes().nodes, now, keep):
            if self.retention.remove_node(name, now - keep, self._token()):
                keys = self.bus.delete_queue(node_queue(name))
                event(log, "node_removed", node=name, bus_keys=keys, retention_s=f"{keep:g}")
