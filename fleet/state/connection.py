"""Redis connections and the translation of redis errors into fleet's error tree."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from importlib import resources
from typing import Any, ParamSpec, TypeVar

import redis

from fleet.config import Settings, redact
from fleet.errors import StoreUnavailable
from fleet.state.sentinel import sentinel_pool

P = ParamSpec("P")
R = TypeVar("R")


#: how long a call waits for a connection of a bounded pool to come free before it fails
POOL_WAIT_S = 10


def connect(settings: Settings, db: int | None = None, *, most: int | None = None) -> redis.Redis:
    """A client for the state DB (or ``db``), with timeouts so a dead Redis never hangs a service.
    ``most``: at most that many connections, a call beyond waiting for one (``POOL_WAIT_S``) instead
    of failing ("Too many connections" once more threads than the pool's 100 called at once)."""
    options: dict[str, Any] = {"decode_responses": True}
    if most is not None:
        options.update(max_connections=most, timeout=POOL_WAIT_S, pool_class=redis.BlockingConnectionPool)
    client = redis.Redis(connection_pool=pool(settings, db, **options))
    setattr(client, REPLICAS_ACK, (settings.replicas_ack(), settings.redis_replicas_ack_timeout_ms))
    return client


#: the attribute of a client that holds how many replicas its acknowledged writes wait for, and for
#: how many ms (``fleet.state.replication``)
REPLICAS_ACK = "_fleet_replicas_ack"


def connect_binary(settings: Settings) -> redis.Redis:
    """A client for the state DB that returns bytes (directories shipped with jobs)."""
    return redis.Redis(connection_pool=pool(settings, None, decode_responses=False))


def pool(settings: Settings, db: int | None = None, **options: Any) -> redis.ConnectionPool:
    """A connection pool for ``db`` with the ACL username and password passed apart from the URL
    (never spliced in); ``options`` override the default timeouts. With ``redis_sentinels``, its
    connections go to whichever Redis the sentinels name primary (:mod:`fleet.state.sentinel`)."""
    defaults = {"socket_connect_timeout": 2, "socket_timeout": 5, "health_check_interval": 10}
    options = {**defaults, **settings.redis_credentials(), **options}
    kind: type[redis.ConnectionPool] = options.pop("pool_class", redis.ConnectionPool)
    if settings.redis_sentinels:
        return sentinel_pool(settings, settings.redis_url_for(db), kind, options)
    return kind.from_url(settings.redis_url_for(db), **options)


def translated(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn redis connection failures, and writes refused at ``maxmemory``, into
    :class:`StoreUnavailable` (retryable: retention frees memory, an operator can raise the limit)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"redis unavailable: {redact(str(exc))}") from exc
        except redis.exceptions.OutOfMemoryError as exc:
            raise StoreUnavailable(
                "redis is out of memory: it refuses writes at maxmemory (fleet never lets it evict its "
                "data); raise maxmemory in redis.conf, or shorten job_retention_s or log_max_lines"
            ) from exc

    return wrapper


@translated
def used_memory(client: redis.Redis) -> int:
    """Bytes Redis has allocated for its data, every logical DB (``INFO memory`` ``used_memory``)."""
    return int(client.info("memory")["used_memory"])


def load_scripts(client: redis.Redis) -> dict[str, Any]:
    """Every Lua script in ``fleet/state/lua`` registered on ``client``, by file stem: registered once
    per client and kept on it, so each store built on that client shares them."""
    scripts: dict[str, Any] | None = getattr(client, _SCRIPTS, None)
    if scripts is None:
        scripts = {name: client.register_script(text) for name, text in _script_texts().items()}
        setattr(client, _SCRIPTS, scripts)
    return scripts


#: the attribute of a client that holds its registered scripts
_SCRIPTS = "_fleet_scripts"


@functools.cache
def _script_texts() -> dict[str, str]:
    """The scripts' sources, read once per process (every store of every client registers them).
    A line ``--! include NAME`` is replaced by ``lua/lib/NAME.lua``: Redis scripts cannot share
    functions, and code that keeps an index right must be the same in every script that changes it."""
    folder = resources.files("fleet.state") / "lua"
    lua = [entry for entry in folder.iterdir() if entry.name.endswith(".lua")]
    return {entry.name.removesuffix(".lua"): _included(entry.read_text(), folder / "lib") for entry in lua}


def _included(text: str, lib: Any) -> str:
    return _INCLUDE.sub(lambda m: (lib / f"{m[1]}.lua").read_text(), text)


_INCLUDE = re.compile(r"^--! include (\w+)$", re.MULTILINE)
