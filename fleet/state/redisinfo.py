"""Which Redis is primary, its replicas' lag, and the failovers the services saw: what ``fleet
nodes``, the status page and the controller's metrics show (:class:`fleet.models.RedisStatus`).

Read from the primary's ``INFO replication`` and, with sentinels, from each sentinel, by
:class:`RedisWatch` at most once every ``every_s`` seconds per process, however many requests or
scrapes ask: a fleet's Redis is not asked more because more people look. A fleet with one Redis
costs one ``INFO`` every few seconds while someone looks, nothing while nobody does.

Failovers are seen by the services themselves (:func:`fleet.state.sentinel.failovers_seen`, when a
connection first reaches a new primary); each watch records those its process saw through the
fleet's own sentinels in ``<p>:redis:failovers``, one field per failover (the sentinels' epoch, so
two services that saw one record it once), for the services and the API servers that did not run
through it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
from redis.connection import parse_url

from fleet.config import Settings
from fleet.keys import Keys
from fleet.models import Failover, RedisStatus, ReplicaLag
from fleet.state import sentinel

#: seconds between two reads of the facts by one process
EVERY_S = 5.0
#: failovers kept in ``<p>:redis:failovers``
FAILOVERS_KEPT = 100


def replicas_of(info: dict[str, Any]) -> list[ReplicaLag]:
    """The replicas in a primary's ``INFO replication`` (as redis-py parses it), with their lag."""
    offset = int(info.get("master_repl_offset", 0))
    found = []
    for n in range(int(info.get("connected_slaves", 0))):
        replica = info.get(f"slave{n}")
        if not isinstance(replica, dict):
            continue
        host, port = replica.get("ip", "?"), replica.get("port", "?")
        found.append(
            ReplicaLag(
                address=f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}",
                state=str(replica.get("state", "")),
                lag_bytes=max(offset - int(replica.get("offset", 0)), 0),
                lag_s=int(replica.get("lag", 0)),
            )
        )
    return found


class RedisWatch:
    """The facts of the Redis ``client`` reaches (the state DB's client of ``settings``), read again
    when asked after ``every_s`` seconds."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        settings: Settings,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.keys, self.settings = client, keys, settings
        self.every_s, self.clock = every_s, clock
        self._lock = threading.Lock()
        self._status: RedisStatus | None = None
        self._next = 0.0
        #: when the last failover of this process that this watch recorded was seen
        self._recorded_at = 0.0

    def status(self) -> RedisStatus:
        with self._lock:  # one reader at a time; the others wait for its answer
            if self._status is None or self.clock() >= self._next:
                self._status = self._read()
                self._next = self.clock() + self.every_s
            return self._status

    def _read(self) -> RedisStatus:
        try:
            primary, agreeing = self._primary()
            replicas = replicas_of(self.client.info("replication"))
            failovers, last = self._failovers()
        except redis.RedisError as exc:
            return RedisStatus(
                error=_why(exc), read_at=time.time(), sentinels=len(self.settings.redis_sentinels)
            )
        return RedisStatus(
            primary=primary,
            replicas=replicas,
            sentinels=len(self.settings.redis_sentinels),
            sentinels_agreeing=agreeing,
            failovers=failovers,
            last_failover=last,
            read_at=time.time(),
        )

    def _primary(self) -> tuple[str, int]:
        """The primary's address, and how many sentinels name it (the one most of them name)."""
        if not self.settings.redis_sentinels:
            url = parse_url(self.settings.redis_url_for())  # type: ignore[no-untyped-call]
            host, port = url.get("host", "localhost"), url.get("port", 6379)
            return (f"{host}:{port}" if "path" not in url else str(url["path"])), 0
        named: Counter[str] = Counter()
        for watcher in sentinel.manager(self.settings).sentinels:
            try:
                found = watcher.sentinel_get_master_addr_by_name(self.settings.redis_master)
            except redis.RedisError:
                continue
            if isinstance(found, tuple):
                host = found[0].decode() if isinstance(found[0], bytes) else found[0]
                named[f"{host}:{found[1]}"] += 1
        if not named:
            raise redis.ConnectionError("no sentinel answered with a primary")
        primary, agreeing = named.most_common(1)[0]
        return primary, agreeing

    def _failovers(self) -> tuple[int, Failover | None]:
        """Record this process's failovers not recorded yet; all recorded, and the latest. Each is
        keyed by the sentinels' configuration epoch of its promotion, the same for every process
        that saw it (so it is recorded once); one seen without an epoch (a change of primary the
        sentinels did not make) is logged by the process that saw it, not recorded here."""
        key = self.keys.failovers
        new = [f for f in sentinel.failovers_seen(self.settings) if f.at > self._recorded_at]
        pipe = self.client.pipeline(transaction=False)
        for f in new:
            if f.epoch:
                pipe.hsetnx(key, str(f.epoch), f.model_dump_json())
        pipe.hgetall(key)
        recorded: dict[Any, Any] = pipe.execute()[-1]
        self._recorded_at = max([self._recorded_at, *(f.at for f in new)])
        if len(recorded) > FAILOVERS_KEPT:
            oldest = sorted(recorded, key=int)[: len(recorded) - FAILOVERS_KEPT]
            self.client.hdel(key, *oldest)
        if not recorded:
            return 0, None
        latest = recorded[max(recorded, key=int)]
        return min(len(recorded), FAILOVERS_KEPT), Failover.model_validate_json(latest)


def _why(exc: redis.RedisError) -> str:
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return (
            "this service's Redis user may not run INFO: add +info to its line in users.acl and "
            "ACL LOAD (README, Redis users)"
        )
    return f"{type(exc).__name__}: {exc}"
