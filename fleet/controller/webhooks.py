"""The leader's webhook sender: a thread of its own, never part of a scheduling pass.

Each round (``webhook_interval_s``) it turns what happened into deliveries, stored in Redis with the
outbox cursor in one transaction: the jobs the outbox says ended (transition.lua and cancel.lua
append them) become one delivery per URL (the job's ``notify``, its tenant's ``webhook``), and node
states that changed since the last announced one (DOWN is a lease gone, which nothing writes, so
states are compared rather than logged) one per tenant whose webhook asked for nodes. Then it sends
what is due on ``webhook_threads`` threads: a 2xx answer ends a delivery; anything else is tried
again after a backoff, ``webhook_attempts`` times in all, each outcome logged and kept for
``Client.webhook_deliveries()``. Delivery is at least once (a new leader may repeat one in flight).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from fleet import __version__
from fleet.config_sections import ControllerSettings
from fleet.log import StepHealth, event
from fleet.models import Job, Tenant, Webhook, WebhookOutcome
from fleet.state import JobStore, NodeStore
from fleet.state.tenants import TenantStore
from fleet.state.webhooks import INIT, Delivery, WebhookStore
from fleet.webhooks import (
    SIGNATURE_HEADER,
    IPNetwork,
    backoff,
    body_for,
    job_payload,
    node_payload,
    post,
    shown_url,
    sign,
)

log = logging.getLogger("fleet.controller.webhooks")
#: outbox entries turned into deliveries per round; deliveries started per round
BATCH = 500


class WebhookSender:
    def __init__(
        self,
        jobs: JobStore,
        nodes: NodeStore,
        tenants: TenantStore,
        store: WebhookStore,
        cfg: ControllerSettings,
        clock: Callable[[], float],
        leading: Callable[[], bool],
        allowed: Sequence[IPNetwork] = (),
    ) -> None:
        self.jobs, self.nodes, self.tenants, self.store = jobs, nodes, tenants, store
        self.cfg, self.clock, self.leading = cfg, clock, leading
        #: networks the operator allows besides public addresses (webhook_allowed_networks)
        self._allowed = allowed
        self._pool = ThreadPoolExecutor(cfg.webhook_threads, thread_name_prefix="webhook")
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._health = StepHealth(log)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.cfg.webhook_interval_s):
            if self.leading():
                self._health.guard(self.round)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def round(self) -> None:
        now = self.clock()
        policies = {t.name: t for t in self.tenants.all()}
        self.collect_jobs(now, policies)
        self.collect_nodes(now, policies)
        self.send_due(now)

    # -- what happened -> deliveries ---------------------------------------------------------

    def collect_jobs(self, now: float, policies: dict[str, Tenant]) -> int:
        entries = self.store.outbox_after(BATCH)
        if not entries:
            return 0
        jobs = {j.id: j for j in self.jobs.get_many({fields["id"] for _, fields in entries})}
        deliveries = []
        for entry_id, fields in entries:
            job = jobs.get(fields["id"])
            if job is not None:  # deleted meanwhile (retention): nothing left to say
                deliveries += self._for_job(entry_id, job, policies.get(job.spec.tenant), now)
        self.store.enqueue(deliveries, now, cursor=entries[-1][0])
        return len(deliveries)

    def _for_job(self, entry_id: str, job: Job, policy: Tenant | None, now: float) -> list[Delivery]:
        hooks = [h for h in (job.spec.notify, policy.webhook if policy else None) if h is not None]
        found = []
        for n, hook in enumerate(dict.fromkeys(hooks)):  # one POST per distinct URL and format
            did = f"{entry_id}-{n}"
            payload = job_payload(job, did, now)
            found.append(self._delivery(did, job.spec.tenant, hook, "job.ended", job.id, now, payload))
        return found

    def collect_nodes(self, now: float, policies: dict[str, Tenant]) -> int:
        listeners = [t for t in policies.values() if t.webhook is not None and t.webhook_nodes]
        if not listeners:  # nobody listens: no reads; the next listener starts from a fresh first look
            self.store.forget_nodes()
            return 0
        names = self.nodes.names()
        states, announced = self.store.node_states(names), self.store.announced()
        if INIT not in announced:  # the first look (a new fleet, or one from before webhooks): no news
            self.store.enqueue([], now, nodes={INIT: "1", **{n: s for n, (s, _) in states.items()}})
            return 0
        changes: dict[str, str | None] = {n: s for n, (s, _) in states.items() if announced.get(n) != s}
        changes |= {n: None for n in announced.keys() - states.keys() - {INIT}}
        if not changes:
            return 0
        deliveries = []
        for name, state in changes.items():
            reason = states[name][1] if name in states else "removed by retention (node_retention_s)"
            for tenant in listeners:
                assert tenant.webhook is not None
                did = f"node-{name}-{now:.3f}-{tenant.name}"
                payload = node_payload(name, state or "removed", announced.get(name, "new"), reason, did, now)
                deliveries.append(
                    self._delivery(did, tenant.name, tenant.webhook, "node.changed", name, now, payload)
                )
        self.store.enqueue(deliveries, now, nodes=changes)
        return len(deliveries)

    @staticmethod
    def _delivery(
        did: str, tenant: str, hook: Webhook, kind: str, subject: str, now: float, payload: dict[str, object]
    ) -> Delivery:
        return Delivery(
            id=did,
            tenant=tenant,
            url=hook.url,
            format=hook.format,
            event=kind,
            subject=subject,
            payload=payload,
            created_at=now,
        )

    # -- sending -----------------------------------------------------------------------------

    def send_due(self, now: float) -> int:
        started = 0
        for delivery in self.store.due(now, BATCH):
            with self._lock:
                if delivery.id in self._in_flight:
                    continue
                self._in_flight.add(delivery.id)
            self._pool.submit(self._guarded_send, delivery)
            started += 1
        return started

    def _guarded_send(self, delivery: Delivery) -> None:
        try:
            self._health.guard(lambda: self.send(delivery))
        finally:
            with self._lock:
                self._in_flight.discard(delivery.id)

    def send(self, delivery: Delivery) -> WebhookOutcome:
        """One attempt: POST, then record how it went (and when the next is due)."""
        body = body_for(delivery.payload, delivery.format)
        secret = self.store.secret(delivery.tenant)
        headers = {"X-Fleet-Event": delivery.event, "X-Fleet-Delivery": delivery.id}
        headers |= {"User-Agent": f"fleet/{__version__}", SIGNATURE_HEADER: sign(secret, body)}
        code, said = post(delivery.url, body, headers, self.cfg.webhook_timeout_s, self._allowed)
        attempt, now = delivery.attempts + 1, self.clock()
        outcome = WebhookOutcome(
            at=now,
            delivery=delivery.id,
            tenant=delivery.tenant,
            event=delivery.event,
            subject=delivery.subject,
            url=shown_url(delivery.url),
            status="delivered",
            attempt=attempt,
            code=code,
        )
        if code is not None and 200 <= code < 300:
            self.store.finish(delivery, outcome)
            event(log, "webhook_delivered", id=delivery.id, url=outcome.url, attempt=attempt, code=code)
            return outcome
        error = said if code is None else f"HTTP {code}: {said}"[:300]
        if attempt >= self.cfg.webhook_attempts:
            outcome = outcome.model_copy(update={"status": "failed", "error": error})
            self.store.finish(delivery, outcome)
            event(
                log,
                "webhook_failed",
                logging.WARNING,
                id=delivery.id,
                url=outcome.url,
                attempts=attempt,
                error=error,
            )
            return outcome
        at = now + backoff(attempt, self.cfg.webhook_backoff_s)
        outcome = outcome.model_copy(update={"status": "retrying", "error": error, "next_at": at})
        self.store.retry(delivery.model_copy(update={"attempts": attempt, "error": error}), at, outcome)
        event(
            log,
            "webhook_retrying",
            logging.WARNING,
            id=delivery.id,
            url=outcome.url,
            attempt=attempt,
            error=error,
            next_in_s=f"{at - now:.1f}",
        )
        return outcome
