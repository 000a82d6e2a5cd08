"""The controller service: the only place that decides placement.

One controller holds the leader lease and runs a scheduling pass on every relevant message
(submit, exit, node joined) and periodically; the others wait to take over. This module keeps the
leader's state in memory (the queue, the node views) and runs the steps. A pass is
``fleet.scheduler.passes.run_pass`` (pure: elastic step, placement, preemption, as ``fleet sim``
runs it too) over those and what ``tenancy.py`` (the tenants' policies, holdings, decayed usage,
holds) and ``elasticity.py`` (the elastic jobs and their profiles) keep; ``apply.py`` carries its
plan out. ``upkeep.py`` carries out the periodic reconcile (``reconcile.py``, pure: lost nodes,
launch deadlines, drains, orphan claims) and retention (``retention.py``, pure).
Every write is fenced by the leader token; a refused one makes this controller step down at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from fleet import metrics
from fleet.bus import (
    CONTROLLER_QUEUE,
    AttemptUpdate,
    Bus,
    JobSubmitted,
    NodeChanged,
    QueueLeft,
)
from fleet.config import Settings
from fleet.controller import snapshot
from fleet.controller.apply import Applier
from fleet.controller.elasticity import Elasticity
from fleet.controller.leader import LeaderLease
from fleet.controller.reconcile import Buckets
from fleet.controller.tenancy import Tenancy
from fleet.controller.upkeep import Upkeep
from fleet.controller.webhooks import WebhookSender
from fleet.errors import FleetError, NotLeader
from fleet.lifecycle import RetryPolicy
from fleet.log import StepHealth, event
from fleet.models import Job, JobState, Node
from fleet.scheduler import NodeView, PendingQueue, Plan
from fleet.scheduler.passes import PassInput, PassSettings, run_pass
from fleet.sdnotify import Notifier
from fleet.state import JobStore, NodeStore, Stores
from fleet.state.records import JobBatch, NodeBatch
from fleet.versions import VERSION
from fleet.webhooks import networks

log = logging.getLogger("fleet.controller")


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
        stores = Stores.of(settings, jobs, nodes)
        self.retention, self.ranked = stores.retention, stores.ranked
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
        self._lease_until = 0.0
        #: the incremental scheduler core's state: the queue and the node views, kept in memory
        self.queue = PendingQueue()
        self._views: dict[str, NodeView] = {}
        #: each node as last read, and the nodes-changed version that read saw (see fleet.keys)
        self._nodes: dict[str, Node] = {}
        self._node_version = 0
        self._views_changed = False
        self._next_full_reconcile = 0.0
        self._lock = threading.Lock()
        self._touched_jobs: set[str] = set()
        self._touched_nodes: set[str] = set()
        #: max_running of the arrays whose tasks are queued (read with the tasks)
        self._array_limits: dict[str, int] = {}
        self._next_resync = 0.0
        self._reload = False
        self._next_count = 0.0
        self.tenants = stores.tenants
        self.tenancy = Tenancy(self.tenants, self.cfg)
        #: the jobs the last pass could not place (what a preemption could be for)
        self._blocked: list[str] = []
        self._tenants_changed = False
        self.elasticity = Elasticity(self.cfg, stores.profiles)
        self._elastic_changed = False
        self._next_elastic = 0.0
        self._settings = PassSettings(
            preemption=self.cfg.preemption,
            elastic=self.cfg.elastic,
            resize_cost_s=self.cfg.resize_cost_s,
            min_interval_s=self.cfg.elastic_min_interval_s,
            half_life_s=self.cfg.fair_share_half_life_s,
        )
        self.applier, self.upkeep = Applier(self), Upkeep(self)
        self.registry, self._pass_seconds = metrics.controller_registry(jobs, nodes, self.tenants)
        store = stores.webhooks
        allowed = networks(settings.webhook_allowed_networks)  # besides public addresses
        self.webhooks = WebhookSender(
            jobs, nodes, self.tenants, store, self.cfg, clock, self.leading, allowed
        )

    def run(self) -> None:
        event(log, "controller_start", id=self.id, redis=self.settings.redis_display, version=VERSION)
        metrics.serve(self.registry, self.cfg.metrics_port, self.cfg.metrics_address, log)
        for schema in (JobSubmitted, QueueLeft, AttemptUpdate, NodeChanged):
            self.bus.handle(CONTROLLER_QUEUE, schema, self.on_message)
        leader = threading.Thread(target=self._lead_loop, name="leader-lease", daemon=True)
        leader.start()
        hooks = threading.Thread(
            target=self.webhooks.run, args=(self.stop_event,), name="webhooks", daemon=True
        )
        hooks.start()
        periodic = [
            (self.reconcile, self.cfg.schedule_interval_s),
            (self.expire, self.cfg.retention_interval_s),
            (self.refresh_tenants, self.cfg.usage_interval_s),
        ]
        next_run = [0.0] * len(periodic)
        self.notifier.ready(f"controller {self.id}")
        try:
            while not self.stop_event.is_set():
                self.notifier.watchdog()
                if self.leading():
                    for i, (step, every) in enumerate(periodic):
                        if time.monotonic() >= next_run[i]:
                            self._guarded(step)
                            next_run[i] = time.monotonic() + every
                    self._guarded(self.schedule_pass)
                due_in = max(self._due - self.clock(), 0.0) if self.leading() else float("inf")
                self._wake.wait(min(self.cfg.schedule_interval_s, self.cfg.retention_interval_s, due_in))
                self._wake.clear()
        finally:
            self.notifier.stopping()
            self.stop_event.set()
            leader.join(timeout=5)
            self._follow()
            event(log, "controller_stop", id=self.id)

    def on_message(self, msg: Any) -> None:
        """Messages are hints: note what they name, the next pass reads it from state."""
        with self._lock:
            if isinstance(msg, JobSubmitted):
                self._touched_jobs.add(msg.job_id)
            elif isinstance(msg, QueueLeft):
                self._touched_jobs.update(msg.job_ids)
                self._next_resync = 0.0 if msg.resync else self._next_resync
            elif isinstance(msg, AttemptUpdate):
                self._touched_jobs.add(msg.job_id)
                self._touched_nodes.add(msg.node)
            elif isinstance(msg, NodeChanged):
                self._touched_nodes.add(msg.node)
        self._wake.set()

    def leading(self) -> bool:
        """Holding the lease, with a renewal recent enough that it cannot have lapsed."""
        return bool(self.lease.value) and time.monotonic() < self._lease_until

    def _lead_loop(self) -> None:
        """Renew the lease on its own thread, so a long pass never loses it; a pass checks
        ``leading()`` before it places, and placements are fenced by the token anyway."""
        renew_every = self.cfg.leader_lease_s / 3
        while not self.stop_event.is_set():
            self._guarded(self._lead)
            self.stop_event.wait(renew_every)

    def _lead(self) -> None:
        was = bool(self.lease.value)
        started = time.monotonic()
        try:
            leading = self.lease.renew()
        except FleetError:
            self.lease.value = ""
            raise
        finally:
            if was and not self.lease.value:
                event(log, "leadership_lost", id=self.id)
                self._follow()
        if leading:
            self._lease_until = started + self.cfg.leader_lease_s
        if leading and not was:
            event(log, "leadership_acquired", id=self.id, lease=self.lease.value)
            self._reload = True  # what a follower kept in memory may be stale: load it all again
            self._tracked = False
            self._worker = self.bus.worker(CONTROLLER_QUEUE, self.cfg.worker_threads)
            self._wake.set()

    def token(self) -> str:
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
        """One pass (``fleet.scheduler.passes.run_pass``), carried out by ``apply.Applier``; the
        placements it made."""
        with self._pass_seconds.time():
            try:
                return self._schedule_pass()
            except NotLeader:
                self._deposed()
                return Plan()

    def _schedule_pass(self) -> Plan:
        """Cost follows what changed: the queue lives in memory (``PendingQueue``), refreshed from
        the jobs and nodes the messages named, fully resynced from Redis every ``resync_interval_s``.
        A pass with nothing new, no backoff ending, no elastic step due and nobody to preempt for
        does nothing."""
        now = self.clock()
        changed = self._refresh(now)
        resize = self._elastic_due(changed)
        place = changed or now >= self.queue.next_due()
        blocked = self._blocked if self.cfg.preemption else []
        if not (resize or place or blocked):
            return Plan()
        tenancy = self.tenancy
        inp = PassInput(
            queue=self.queue, views=list(self._views.values()), policies=tenancy.policies,
            running=tenancy.running, usage=tenancy.usage, holds=tenancy.holds, settings=self._settings,
            elastic=self.elasticity.step_jobs(self.queue) if resize else (), resize=resize, place=place,
            blocked=self._blocked, array_room=self._array_room() if place else {},
        )  # fmt: skip
        plan = run_pass(inp, now)
        if not self.leading():
            return Plan()  # the lease may have lapsed during the pass: do nothing
        self._blocked, tenancy.holds = plan.blocked, plan.holds
        self.applier.apply(plan, now)
        self._due = self.queue.next_due()
        return plan.placed

    def _elastic_due(self, changed: bool) -> bool:
        """The elastic step runs when anything changed, else every ``elastic_interval_s``."""
        changed |= self._elastic_changed
        if not self.elasticity.jobs or (not changed and time.monotonic() < self._next_elastic):
            return False
        self._elastic_changed, self._next_elastic = False, time.monotonic() + self.cfg.elastic_interval_s
        return True

    def touch(self, jobs: Iterable[str] = (), nodes: Iterable[str] = ()) -> None:
        """Read these jobs and nodes again at the next pass (what was written may have moved on)."""
        with self._lock:
            self._touched_jobs.update(jobs)
            self._touched_nodes.update(nodes)

    def known_node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def _array_room(self) -> dict[str, int]:
        """How many more tasks each limited array waiting here may start (max_running - on nodes)."""
        arrays = self.queue.arrays() & self._array_limits.keys()
        if not arrays:
            return {}
        active = self.jobs.array_active_counts(arrays)
        return {a: self._array_limits[a] - active.get(a, 0) for a in arrays}

    def _refresh(self, now: float) -> bool:
        """Bring the queue and the node views up to date; True when anything changed."""
        with self._lock:
            jobs, nodes = self._touched_jobs, self._touched_nodes
            self._touched_jobs, self._touched_nodes = set(), set()
        if self._reload:
            self._reload, self.queue, self._views, self._next_resync = False, PendingQueue(), {}, 0.0
            self._nodes, self._next_full_reconcile = {}, 0.0
        if time.monotonic() >= self._next_resync or self._queue_drifted():
            self._next_resync = time.monotonic() + self.cfg.resync_interval_s
            jobs |= self._resync_queue()
        queue_changed = self._load_jobs(jobs, now) if jobs else False
        tenants_changed, self._tenants_changed = self._tenants_changed, False
        return self._refresh_nodes(nodes, now) | queue_changed | tenants_changed

    def _queue_drifted(self) -> bool:
        """Each ``schedule_interval_s``, one cheap count: a submit whose message was lost shows up
        here within seconds, not at the next full resync."""
        if time.monotonic() < self._next_count:
            return False
        self._next_count = time.monotonic() + self.cfg.schedule_interval_s
        return self.jobs.count_queued() != len(self.queue)

    def _resync_queue(self) -> set[str]:
        """State is the truth: the ids to (re)load so the queue in memory matches Redis (and the
        rank index that positions are read from matches the queue)."""
        self.ranked.backfill()
        self.ranked.repair()
        stored = set(self.jobs.queued_ids())
        for gone in set(self.queue.jobs) - stored:
            self.queue.discard(gone)
        return stored - set(self.queue.jobs)

    def _load_jobs(self, ids: set[str], now: float) -> bool:
        """Read these jobs into the queue or out of it. True when a pass may now place something
        it could not before: the queue gained or lost a job, or a task of an array with a
        ``max_running`` left the nodes (its room grew). Jobs that only moved along on their nodes
        (STARTING, RUNNING) change nothing: freed GPUs come through the nodes' feed."""
        batch = self.jobs.read_many(ids)
        readable = self.readable(batch, now)
        self.tenancy.observe(readable)
        self._elastic_changed |= self.elasticity.observe(readable)
        queued = [j for j in readable if j.state == JobState.QUEUED]
        gone = [job_id for job_id in ids - {j.id for j in queued} if self.queue.discard(job_id) is not None]
        added = self.queue.add_many([snapshot.pending(j) for j in queued], {j.id: j.reason for j in queued})
        self._array_limits.update({j.array_id: j.array_max_running for j in queued
                                   if j.array_id and j.array_max_running})  # fmt: skip
        room = any(j.array_id in self._array_limits and not j.state.on_node for j in readable)
        return bool(gone or added or room)

    def _refresh_nodes(self, names: set[str], now: float) -> bool:
        """Read the nodes whose view changed: those the nodes-changed feed names since the last look
        (heartbeats whose placement digest changed, admin states, jobs placed or released), and those
        messages and lease checks named; every node when none is known yet or the feed's counter
        went back (the full reconcile reads every node each ``resync_interval_s`` too, see
        ``_install``). True when a view changed."""
        changed, version = self.nodes.changed_since(self._node_version)
        if not self._nodes or version < self._node_version:
            self._install(self._read_nodes(), now)
        elif names := names | set(changed):
            self._install(self._read_nodes(sorted(names), all_claims=False), now, names)
        self._node_version = version
        dirty, self._views_changed = self._views_changed, False
        return dirty

    def _install(self, batch: NodeBatch, now: float, names: set[str] | None = None) -> None:
        """Take the nodes just read as the scheduler's views: all of them (``names`` None), or those
        named (a name not in the batch is gone or unreadable: its view goes)."""
        if names is None:
            views, nodes = {}, {}
        else:
            views = {n: v for n, v in self._views.items() if n not in names}
            nodes = {n: v for n, v in self._nodes.items() if n not in names}
        views.update({n.name: snapshot.node_view(n, now, self.cfg.topology_label) for n in batch.nodes})
        nodes.update({n.name: n for n in batch.nodes})
        self._views_changed |= views != self._views
        self._views, self._nodes = views, nodes

    # -- tenancy -----------------------------------------------------------------------

    def refresh_tenants(self) -> None:
        """Re-read the tenants' policies, fold what runs into their usage, publish their status."""
        try:
            if self.tenancy.refresh(self.queue, list(self._views.values()), self.clock(), self.token()):
                self._tenants_changed = True
        except NotLeader:
            self._deposed()

    # -- unreadable records ------------------------------------------------------------

    def readable(self, batch: JobBatch, now: float) -> list[Job]:
        """The jobs that parsed; the others are quarantined (each logged once, by whoever leads)."""
        for job_id, reason in batch.corrupt.items():
            if self.jobs.quarantine(job_id, reason, now, self.token()):
                event(log, "record_quarantined", logging.WARNING, kind="job", id=job_id, reason=reason)
        return batch.jobs

    def _read_nodes(self, names: list[str] | None = None, all_claims: bool = True) -> NodeBatch:
        """Nodes as stored; an unreadable record is left out of scheduling and quarantined (logged
        once), and forgotten from quarantine once it reads again (an agent rewrote it)."""
        names = self.nodes.names() if names is None else names
        batch = self.nodes.read(names, all_claims)
        for name, reason in batch.corrupt.items():
            if self.nodes.quarantine(name, reason, self.token()):
                event(log, "record_quarantined", logging.WARNING, kind="node", id=name, reason=reason)
        for name in (batch.quarantined.keys() & set(names)) - batch.corrupt.keys():
            if self.nodes.quarantine(name, "", self.token()):
                event(log, "record_recovered", kind="node", id=name)
        return batch

    # -- failure detection -------------------------------------------------------------

    def reconcile(self) -> Buckets:
        """Requeue lost and stuck jobs, move drains along, free orphan claims (see reconcile.py)."""
        try:
            return self.upkeep.reconcile()
        except NotLeader:
            self._deposed()
            return Buckets()

    # -- retention ---------------------------------------------------------------------

    def expire(self) -> int:
        """Delete ended jobs past ``job_retention_s`` and nodes gone for ``node_retention_s`` (see
        retention.py); the number of jobs deleted."""
        try:
            if not self._tracked:
                self.upkeep.track_ended()
            deleted = self.upkeep.expire_jobs()
            self.upkeep.remove_gone_nodes()
            return deleted
        except NotLeader:
            self._deposed()
            return 0
