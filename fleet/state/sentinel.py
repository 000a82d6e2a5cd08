"""Connections to whichever Redis the sentinels name primary (``redis_sentinels``, ``redis_master``).

redis-py's :class:`~redis.sentinel.SentinelConnectionPool` asks the sentinels for the primary's
address each time it opens a connection, so after a failover every new connection reaches the
promoted replica: nothing in fleet holds an address. Connections open to the old primary fail
(it died), or, if it lives on demoted to a replica, their next write answers ``READONLY``, which
redis-py's :class:`~redis.sentinel.SentinelManagedConnection` turns into a ``ConnectionError``
after dropping the connection: to fleet, the same as an outage, retried by whoever called. One cut
off by a partition and reached again before the sentinels demote it is still a primary, with no
replica: a write it takes is not replicated, and that makes the pool ask the sentinels again
(:func:`follow_primary`). Registered Lua scripts need nothing: :class:`redis.commands.core.Script`
loads itself again when the new primary answers ``NOSCRIPT``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool, SentinelManagedConnection

from fleet.config import Settings
from fleet.log import event
from fleet.models import Failover

log = logging.getLogger("fleet.state")

#: how long asking one sentinel may take before the next is asked
SENTINEL_TIMEOUT_S = 1.0


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A sentinel-managed pool with at most ``max_connections``, a call beyond waiting for one."""


class _Manager(Sentinel):
    """The sentinels, and which primary this process last reached: a connection that reaches
    another logs the failover, once per process, with how long no connection could be opened."""

    def __init__(self, sentinels: list[tuple[str, int]], **options: Any) -> None:
        super().__init__(sentinels, **options)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._primary: tuple[str, int] | None = None
        self._cut_off_at: float | None = None
        #: the sentinels' configuration epoch when they last named a primary: each failover's own
        self._epoch = 0
        #: the last failovers seen through these sentinels (a process lives through few: the oldest
        #: go past 100); another fleet's, which a process that talked to it also saw, are not these
        self.seen: deque[Failover] = deque(maxlen=100)

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """Sentinel.discover_master, whose error says what each sentinel said in a line (redis-py's
        holds each client's whole repr) and which settings to look at. A sentinel leading a failover
        is not asked: it names the old primary until the failover ends (the replicas reconfigured, a
        second or more after the promotion), when the others already name the new one."""
        said = []
        for n, sentinel in enumerate(self.sentinels):
            where = "{host}:{port}".format_map(sentinel.connection_pool.connection_kwargs)
            try:
                masters: dict[str, Any] = sentinel.sentinel_masters()  # type: ignore[assignment]
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                said.append(f"{where}: {type(exc).__name__}: {exc}")
                continue
            state = masters.get(service_name)
            if state and "failover_in_progress" in _flags(state):
                said.append(f"{where}: its failover is under way")
                continue
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                self.sentinels[0], self.sentinels[n] = sentinel, self.sentinels[0]  # ask it first next time
                self._epoch = int(state.get("config-epoch", 0))
                return state["ip"], int(state["port"])
            said.append(f"{where}: {'its primary is down' if state else 'watches no ' + repr(service_name)}")
        raise MasterNotFoundError(
            f"no sentinel names a primary {service_name!r} that is up ({'; '.join(said)}): check "
            "redis_master, redis_sentinels and the sentinels' login (redis_sentinel_*)"
        )

    def cut_off(self, since: float) -> None:
        with self._lock:
            if self._cut_off_at is None:
                self._cut_off_at = since

    def reached(self, address: tuple[str, int], since: float) -> None:
        """A connection begun at ``since`` reached ``address``; if that is another primary than
        before, log the failover, counted from the first connection that could not be opened."""
        with self._lock:
            previous, first = self._primary, min(self._cut_off_at or since, since)
            self._primary, self._cut_off_at = address, None
        if previous is not None and previous != address:
            cut_off = round(time.monotonic() - first, 1)
            seen = Failover(
                at=time.time(),
                primary=_named(address),
                previous=_named(previous),
                cut_off_s=cut_off,
                epoch=self._epoch,
            )
            global _count
            with _lock:
                self.seen.append(seen)
                _count += 1
            event(
                log,
                "redis_failover",
                primary=seen.primary,
                previous=seen.previous,
                cut_off_s=f"{cut_off:.1f}",
            )


class _Connection(SentinelManagedConnection):
    """A connection to the primary that tells its manager whether, and since when, it tried to open."""

    _began = 0.0

    def connect(self) -> None:
        self._began = time.monotonic()  # asking the sentinels may take a while: from here
        try:
            super().connect()  # type: ignore[no-untyped-call]
        except redis.ConnectionError:  # the primary refused, or the sentinels named none
            self._manager().cut_off(self._began)
            raise

    def connect_to(self, address: tuple[str, int]) -> None:
        super().connect_to(address)  # type: ignore[no-untyped-call]
        self._manager().reached(address, self._began)

    def _manager(self) -> _Manager:
        manager: _Manager = self.connection_pool.sentinel_manager
        return manager


def follow_primary(client: redis.Redis) -> None:
    """Ask the sentinels which Redis is primary now; if ``client``'s connections reach another, drop
    them (the idle ones at once, the others as they come back to the pool), so its next call opens a
    connection to the primary. For a write that was not replicated: a primary cut off by a partition
    that heals before the sentinels demote it (they look at it again within 10 s) still answers
    writes, with no replica to take them, and a connection open to it from before the partition
    would go on reaching it until then, nothing acknowledged. A client without sentinels: nothing;
    sentinels that name no primary (a failover under way): nothing either, the write stays short."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        # redis-py's own rule: a pool whose primary moved drops its idle connections, and takes back
        # no connection to another address
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            pool.get_master_address()  # type: ignore[no-untyped-call]


def _flags(state: dict[str, Any]) -> set[str]:
    """A sentinel's flags of a primary: a comma-separated string in RESP2, a set in RESP3."""
    flags = state.get("flags", "")
    return set(flags.split(",")) if isinstance(flags, str) else set(flags)


def _named(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def sentinel_pool(
    settings: Settings, url: str, kind: type[redis.ConnectionPool], options: dict[str, Any]
) -> SentinelConnectionPool:
    """A pool of connections to the primary for ``url``'s DB (its host and port are not dialled),
    with ``options`` as :func:`fleet.state.connection.pool` gives them; a username or password in
    the URL wins, as with a plain URL."""
    given = {k: v for k, v in parse_url(url).items() if k not in ("host", "port")}  # type: ignore[no-untyped-call]
    blocking = issubclass(kind, redis.BlockingConnectionPool)
    cls = BlockingSentinelPool if blocking else SentinelConnectionPool
    options = {**options, **given, "connection_class": _Connection}
    return cls(settings.redis_master, _manager(settings), **options)  # type: ignore[no-untyped-call]


def _manager(settings: Settings) -> _Manager:
    """The process's one :class:`Sentinel` for these sentinels and login: each holds a connection
    pool per sentinel, and services open pools (bus consumers, stream readers) all their lives."""
    login = settings.sentinel_credentials()
    key = (tuple(settings.sentinel_addresses()), tuple(sorted(login.items())))
    with _lock:
        manager = _managers.get(key)
        if manager is None:
            options: dict[str, Any] = {
                "socket_connect_timeout": SENTINEL_TIMEOUT_S,
                "socket_timeout": SENTINEL_TIMEOUT_S,
                # redis-py retries each client 3 times with backoff (~3 s for a refused connection):
                # a sentinel that is down must cost one try, the next sentinel is asked at once
                "retry": Retry(NoBackoff(), 0),
            }
            manager = _managers[key] = _Manager(list(key[0]), sentinel_kwargs={**options, **login})
        return manager


def failovers_seen(settings: Settings) -> list[Failover]:
    """The failovers this process saw through ``settings``' sentinels (each once, when it first
    reached the new primary), oldest first; none where it opened no connection through them. Looked
    up, not made: no sentinel login read, nothing created for a fleet without sentinels."""
    addresses = tuple(settings.sentinel_addresses())
    with _lock:
        seen = [f for (where, _), manager in _managers.items() if where == addresses for f in manager.seen]
    return sorted(seen, key=lambda f: f.at)


def failover_count() -> int:
    """How many failovers this process saw since it started."""
    return _count


def manager(settings: Settings) -> Sentinel:
    """The process's sentinels for ``settings`` (asked for the primary, as its connections do)."""
    return _manager(settings)


_lock = threading.Lock()
_managers: dict[tuple[Any, ...], _Manager] = {}
_count = 0
