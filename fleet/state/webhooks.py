"""Webhook deliveries in Redis: the outbox the Lua scripts append ended jobs to, the deliveries not
yet done (kept in Redis, so a new leader goes on where the last one stopped), their outcomes, the
node states last announced, and each tenant's signing secret. Keys: see :mod:`fleet.keys`."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

import redis
from pydantic import BaseModel

from fleet.keys import Keys
from fleet.models import WebhookOutcome
from fleet.state.connection import translated

#: outcomes kept (the newest), for ``Client.webhook_deliveries()``
LOG_MAX = 1000
#: the announced-nodes hash's field saying the first look was taken
INIT = "@init"


class Delivery(BaseModel):
    """One POST to make (and make again until it is answered 2xx or its attempts are spent)."""

    id: str
    tenant: str
    url: str
    format: str = "json"
    event: str
    #: the job id or node name it is about
    subject: str
    payload: dict[str, Any]
    attempts: int = 0
    error: str = ""
    created_at: float = 0.0


class WebhookStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis: Any = client
        self.keys = keys

    # -- secrets -------------------------------------------------------------------------

    @translated
    def secret(self, tenant: str) -> str:
        """The tenant's signing secret, made on first use."""
        key = self.keys.webhooks("secrets")
        self.redis.hsetnx(key, tenant, _new_secret())
        return str(self.redis.hget(key, tenant))

    @translated
    def rotate(self, tenant: str) -> str:
        """A new secret for the tenant; deliveries are signed with it from now on."""
        secret = _new_secret()
        self.redis.hset(self.keys.webhooks("secrets"), tenant, secret)
        return secret

    # -- the outbox and announced node states ----------------------------------------------

    @translated
    def outbox_after(self, count: int) -> list[tuple[str, dict[str, str]]]:
        """Up to ``count`` outbox entries after the cursor, oldest first."""
        cursor = self.redis.get(self.keys.webhooks("cursor"))
        low = f"({cursor}" if cursor else "-"
        return list(self.redis.xrange(self.keys.outbox, min=low, count=count))

    @translated
    def announced(self) -> dict[str, str]:
        return dict(self.redis.hgetall(self.keys.webhooks("nodes")))

    @translated
    def forget_nodes(self) -> None:
        self.redis.delete(self.keys.webhooks("nodes"))

    @translated
    def node_states(self, names: list[str]) -> dict[str, tuple[str, str]]:
        """name -> (state as users see it: DOWN without a lease, else the admin state; reason)."""
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hmget(self.keys.node(name), "state", "reason")
            pipe.exists(self.keys.node_lease(name))
        answers = pipe.execute()
        found = {}
        for name, (state, reason), alive in zip(names, answers[0::2], answers[1::2], strict=True):
            found[name] = (
                (state or "READY", reason or "") if alive else ("DOWN", "lease expired (no heartbeat)")
            )
        return found

    # -- deliveries ----------------------------------------------------------------------

    @translated
    def enqueue(
        self,
        deliveries: Iterable[Delivery],
        now: float,
        cursor: str | None = None,
        nodes: dict[str, str | None] | None = None,
    ) -> None:
        """Queue ``deliveries`` (due now) and, in the same transaction, move the outbox cursor and
        record the node states announced (None: forget the node): a leader that dies in between
        leaves nothing half done."""
        pipe = self.redis.pipeline(transaction=True)
        for d in deliveries:
            pipe.hset(self.keys.webhooks("pending"), d.id, d.model_dump_json())
            pipe.zadd(self.keys.webhooks("due"), {d.id: now})
        if cursor is not None:  # what is turned into deliveries leaves the outbox
            pipe.set(self.keys.webhooks("cursor"), cursor)
            ms, _, seq = cursor.partition("-")
            pipe.xtrim(self.keys.outbox, minid=f"{ms}-{int(seq or 0) + 1}")
        for name, state in (nodes or {}).items():
            if state is None:
                pipe.hdel(self.keys.webhooks("nodes"), name)
            else:
                pipe.hset(self.keys.webhooks("nodes"), name, state)
        pipe.execute()

    @translated
    def due(self, now: float, count: int) -> list[Delivery]:
        ids = self.redis.zrangebyscore(self.keys.webhooks("due"), "-inf", now, start=0, num=count)
        if not ids:
            return []
        rows = self.redis.hmget(self.keys.webhooks("pending"), ids)
        return [Delivery.model_validate_json(row) for row in rows if row]

    @translated
    def retry(self, delivery: Delivery, at: float, outcome: WebhookOutcome) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.webhooks("pending"), delivery.id, delivery.model_dump_json())
        pipe.zadd(self.keys.webhooks("due"), {delivery.id: at})
        self._record(pipe, outcome)
        pipe.execute()

    @translated
    def finish(self, delivery: Delivery, outcome: WebhookOutcome) -> None:
        """The delivery is done: answered 2xx, or given up."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(self.keys.webhooks("pending"), delivery.id)
        pipe.zrem(self.keys.webhooks("due"), delivery.id)
        self._record(pipe, outcome)
        pipe.execute()

    def _record(self, pipe: Any, outcome: WebhookOutcome) -> None:
        pipe.xadd(
            self.keys.webhooks("log"), {"o": outcome.model_dump_json()}, maxlen=LOG_MAX, approximate=True
        )

    @translated
    def outcomes(self, tenant: str | None = None, count: int = 100) -> list[WebhookOutcome]:
        """The newest outcomes first (of ``tenant``'s webhooks, or every tenant's)."""
        found = []
        for _, fields in self.redis.xrevrange(self.keys.webhooks("log"), count=LOG_MAX):
            outcome = WebhookOutcome.model_validate_json(fields["o"])
            if tenant is None or outcome.tenant == tenant:
                found.append(outcome)
            if len(found) >= count:
                break
        return found


def _new_secret() -> str:
    return "whsec_" + secrets.token_hex(32)
