"""Connections to whichever Redis the sentinels name primary (``redis_sentinels``, ``redis_master``).

redis-py's :class:`~redis.sentinel.SentinelConnectionPool` asks the sentinels for the primary's
address each time it opens a connection, so after a failover every new connection reaches the
promoted replica: nothing in fleet holds an address. Connections open to the old primary fail
(it died), or, if it lives on demoted to a replica, their next write answers ``READONLY``, which
redis-py's :class:`~redis.sentinel.SentinelManagedConnection` turns into a ``ConnectionError``
after dropping the connection: to fleet, the same as an outage, retried by whoever called.
Registered Lua scripts need nothing: :class:`redis.commands.core.Script` loads itself again when
the new primary answers ``NOSCRIPT``.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

from fleet.config import Settings

#: how long asking one sentinel may take before the next is asked
SENTINEL_TIMEOUT_S = 1.0


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A sentinel-managed pool with at most ``max_connections``, a call beyond waiting for one."""


def sentinel_pool(
    settings: Settings, url: str, kind: type[redis.ConnectionPool], options: dict[str, Any]
) -> SentinelConnectionPool:
    """A pool of connections to the primary for ``url``'s DB (its host and port are not dialled),
    with ``options`` as :func:`fleet.state.connection.pool` gives them; a username or password in
    the URL wins, as with a plain URL."""
    given = {k: v for k, v in parse_url(url).items() if k not in ("host", "port")}  # type: ignore[no-untyped-call]
    blocking = issubclass(kind, redis.BlockingConnectionPool)
    cls = BlockingSentinelPool if blocking else SentinelConnectionPool
    return cls(settings.redis_master, _manager(settings), **{**options, **given})  # type: ignore[no-untyped-call]


def _manager(settings: Settings) -> Sentinel:
    """The process's one :class:`Sentinel` for these sentinels and login: each holds a connection
    pool per sentinel, and services open pools (bus consumers, stream readers) all their lives."""
    login = settings.sentinel_credentials()
    key = (tuple(settings.sentinel_addresses()), tuple(sorted(login.items())))
    with _lock:
        manager = _managers.get(key)
        if manager is None:
            options = {"socket_connect_timeout": SENTINEL_TIMEOUT_S, "socket_timeout": SENTINEL_TIMEOUT_S}
            manager = _managers[key] = Sentinel(list(key[0]), sentinel_kwargs={**options, **login})  # type: ignore[no-untyped-call]
        return manager


_lock = threading.Lock()
_managers: dict[tuple[Any, ...], Sentinel] = {}
