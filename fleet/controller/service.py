"""The controller service: the only place that decides placement.

One controller holds the leader lease and runs a scheduling pass on every relevant message
(submit, exit, node joined) and periodically; the others wait to take over. The controller wires
its parts and runs their steps:

- ``leader.py``: the lease, renewed on its own thread; every write is fenced by its token, and a
  refused one makes this controller step down at once (``Leadership.fenced``, around each step);
- ``views.py``: the leader's state in memory (the queue, the node views), refreshed from what the
  messages name;
- a pass is ``fleet.scheduler.passes.run_pass`` (pure: elastic step, placement, preemption, as
  ``fleet sim`` runs it too) over those and what ``tenancy.py`` (the tenants' policies, holdings,
  decayed usage, holds) and ``elasticity.py`` (the elastic jobs and their profiles) keep;
  ``apply.py`` carries its plan out;
- ``upkeep.py`` carries out the periodic reconcile (``reconcile.py``, pure: lost nodes, launch
  deadlines, drains, orphan claims) and ``expiry.py`` retention (``retention.py``, pure).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from fleet import metrics
from fleet.bus import CONTROLLER_QUEUE, AttemptUpdate, Bus, JobSubmitted, NodeChanged, QueueLeft
from fleet.config import Settings
from fleet.controller.apply import Applier
from fleet.controller.elasticity import Elasticity
from fleet.controller.expiry import Expiry
from fleet.controller.leader import LeaderLease, Leadership
from fleet.controller.reconcile import Buckets
from fleet.controller.tenancy import Tenancy
from fleet.controller.upkeep import Upkeep
from fleet.controller.views import ViewCache
from fleet.controller.webhooks import WebhookSender
from fleet.lifecycle import RetryPolicy
from fleet.log import StepHealth, event
from fleet.models import Job
from fleet.scheduler import Plan
from fleet.scheduler.passes import PassInput, PassSettings, run_pass
from fleet.sdnotify import Notifier
from fleet.state import JobStore, NodeStore, Stores
from fleet.state.redisinfo import RedisWatch
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
        self.leadership = Leadership(
            self.lease, self.cfg.leader_lease_s, bus, self.cfg.worker_threads, self._acquired
        )
        token = self.leadership.token
        self.retention = stores.retention
        self.policy = RetryPolicy(
            settings.retry_backoff_s, settings.retry_backoff_max_s, settings.max_infra_requeues
        )
        self.stop_event = threading.Event()
        self._health = StepHealth(log)
        self.notifier = Notifier()
        self._wake = threading.Event()
        #: earliest end of a queued job's retry backoff: the loop wakes then instead of next interval
        self._due = float("inf")
        self.tenants = stores.tenants
        self.tenancy = Tenancy(self.tenants, self.cfg)
        self._tenants_changed = False
        self.elasticity = Elasticity(self.cfg, stores.profiles)
        self._elastic_changed = False
        self._next_elastic = 0.0
        #: the incremental scheduler core's state: the queue and the node views, kept in memory
        self.views = ViewCache(jobs, nodes, stores.ranked, self.cfg, token, self._observe)
        #: the jobs the last pass could not place (what a preemption could be for)
        self._blocked: list[str] = []
        self._settings = PassSettings(
            preemption=self.cfg.preemption,
            elastic=self.cfg.elastic,
            resize_cost_s=self.cfg.resize_cost_s,
            min_interval_s=self.cfg.elastic_min_interval_s,
            service_s=self.cfg.elastic_service_s,
            half_life_s=self.cfg.fair_share_half_life_s,
        )
        self.applier = Applier(jobs, bus, self.views, self.tenancy, self.elasticity, self.cfg, token)
        self.upkeep = Upkeep(
            jobs,
            nodes,
            bus,
            self.views,
            self.tenancy,
            self.elasticity,
            self.cfg,
            self.policy,
            settings.agent.stop_grace_s,
            clock,
            token,
        )
        self.expiry = Expiry(
            self.retention, nodes, bus, self.views, settings, clock, token, stores.accounting
        )
        watch = RedisWatch(jobs.redis, jobs.keys, settings)
        self.registry, self._pass_seconds = metrics.controller_registry(jobs, nodes, self.tenants, watch)
        store = stores.webhooks
        allowed = networks(settings.webhook_allowed_networks)  # besides public addresses
        self.webhooks = WebhookSender(
            jobs, nodes, self.tenants, store, self.cfg, clock, self.leadership.leading, allowed
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
        leading = self.leadership.leading
        try:
            while not self.stop_event.is_set():
                self.notifier.watchdog()
                if leading():
                    for i, (step, every) in enumerate(periodic):
                        if time.monotonic() >= next_run[i]:
                            self._guarded(step)
                            next_run[i] = time.monotonic() + every
                    self._guarded(self.schedule_pass)
                due_in = max(self._due - self.clock(), 0.0) if leading() else float("inf")
                self._wake.wait(min(self.cfg.schedule_interval_s, self.cfg.retention_interval_s, due_in))
                self._wake.clear()
        finally:
            self.notifier.stopping()
            self.stop_event.set()
            leader.join(timeout=5)
            self.leadership.follow()
            event(log, "controller_stop", id=self.id)

    def on_message(self, msg: Any) -> None:
        """Messages are hints: note what they name, the next pass reads it from state."""
        if isinstance(msg, JobSubmitted):
            self.views.touch(jobs=[msg.job_id])
        elif isinstance(msg, QueueLeft):
            self.views.touch(jobs=msg.job_ids, resync=msg.resync)
        elif isinstance(msg, AttemptUpdate):
            self.views.touch(jobs=[msg.job_id], nodes=[msg.node])
        elif isinstance(msg, NodeChanged):
            self.views.touch(nodes=[msg.node])
        self._wake.set()

    def touch(self, jobs: Iterable[str] = (), nodes: Iterable[str] = ()) -> None:
        """Read these jobs and nodes again at the next pass (what was written may have moved on)."""
        self.views.touch(jobs, nodes)

    def _lead_loop(self) -> None:
        """Renew the lease on its own thread, so a long pass never loses it."""
        renew_every = self.cfg.leader_lease_s / 3
        while not self.stop_event.is_set():
            self._guarded(self.leadership.renew)
            self.stop_event.wait(renew_every)

    def _acquired(self) -> None:
        """Leading now: what a follower kept in memory may be stale, load it all again."""
        self.views.reload()
        self.expiry.tracked = False
        self._wake.set()

    def _guarded(self, step: Callable[[], object]) -> None:
        self._health.guard(step, id=self.id)

    # -- scheduling --------------------------------------------------------------------

    def schedule_pass(self) -> Plan:
        """One pass (``fleet.scheduler.passes.run_pass``), carried out by ``apply.Applier``; the
        placements it made."""
        with self._pass_seconds.time():
            return self.leadership.fenced(self._schedule_pass, Plan())

    def _schedule_pass(self) -> Plan:
        """Cost follows what changed (see ``views.py``). A pass with nothing new, no backoff ending,
        no elastic step due and nobody to preempt for does nothing."""
        now = self.clock()
        tenants_changed, self._tenants_changed = self._tenants_changed, False
        changed = self.views.refresh(now) | tenants_changed
        resize = self._elastic_due(changed)
        queue = self.views.queue
        place = changed or now >= queue.next_due()
        blocked = self._blocked if self.cfg.preemption else []
        if not (resize or place or blocked):
            return Plan()
        tenancy = self.tenancy
        inp = PassInput(
            queue=queue,
            views=list(self.views.views.values()),
            policies=tenancy.policies,
            running=tenancy.running,
            usage=tenancy.usage,
            holds=tenancy.holds,
            settings=self._settings,
            elastic=self.elasticity.step_jobs(queue, now) if resize else (),
            resize=resize,
            place=place,
            blocked=self._blocked,
            array_room=self.views.array_room() if place else {},
        )
        plan = run_pass(inp, now)
        if not self.leadership.leading():
            return Plan()  # the lease may have lapsed during the pass: do nothing
        self._blocked, tenancy.holds = plan.blocked, plan.holds
        self.applier.apply(plan, now)
        self._due = queue.next_due()
        return plan.placed

    def _elastic_due(self, changed: bool) -> bool:
        """The elastic step runs when anything changed, else every ``elastic_interval_s``."""
        changed |= self._elastic_changed
        if not self.elasticity.jobs or (not changed and time.monotonic() < self._next_elastic):
            return False
        self._elastic_changed, self._next_elastic = False, time.monotonic() + self.cfg.elastic_interval_s
        return True

    def _observe(self, jobs: list[Job]) -> None:
        """Jobs just read into the views: the tenants' holdings and the elastic jobs follow them."""
        self.tenancy.observe(jobs)
        self._elastic_changed |= self.elasticity.observe(jobs)

    # -- tenancy, failure detection, retention -------------------------------------------

    def refresh_tenants(self) -> None:
        """Re-read the tenants' policies, fold what runs into their usage, publish their status."""
        self.leadership.fenced(self._refresh_tenants, None)

    def _refresh_tenants(self) -> None:
        views = list(self.views.views.values())
        if self.tenancy.refresh(self.views.queue, views, self.clock(), self.leadership.token()):
            self._tenants_changed = True

    def reconcile(self) -> Buckets:
        """Requeue lost and stuck jobs, move drains along, free orphan claims (see upkeep.py)."""
        return self.leadership.fenced(self.upkeep.reconcile, Buckets())

    def expire(self) -> int:
        """Delete ended jobs past ``job_retention_s`` and nodes gone for ``node_retention_s`` (see
        expiry.py); the number of jobs deleted."""
        return self.leadership.fenced(self.expiry.expire, 0)
