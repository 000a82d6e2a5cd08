"""The Redis checks: Redis answers the agent's ACL user, and this node's clock against Redis'."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from fleet.config import Settings
from fleet.errors import ConfigError
from fleet.ops.doctor.report import FAIL, OK, WARN, Check

#: Redis' clock and this node's further apart than this: a warning (see :func:`clock_check`)
SKEW_WARN_S = 0.5


def redis_check(settings: Settings, source: str = "") -> tuple[Check, redis.Redis | None]:
    """Redis answers this node's ACL user; its version. With the client, None when it failed."""
    from fleet.state.connection import connect

    where = settings.redis_display
    user = settings.redis_username or urlsplit(settings.redis_url).username or "default"
    as_user = f"{user}{source}"
    password = (
        "the password must be the one users.acl holds for the user: give the agent its file "
        "with fleet install agent --redis-password-file FILE (or FLEET_REDIS_USERNAME and "
        "FLEET_REDIS_PASSWORD_FILE)"
    )
    try:
        client = connect(settings)
        hello = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except ConfigError as exc:
        return Check("redis", FAIL, str(exc), password), None
    except redis.AuthenticationError as exc:
        return Check("redis", FAIL, f"{where} refused user {as_user}: {exc}", password), None
    except redis.exceptions.NoPermissionError as exc:
        return Check(
            "redis",
            FAIL,
            f"{where}: user {as_user} may not connect: {exc}",
            "give the user config/users.acl's fleet-agent line (ACL LOAD)",
        ), None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        reach = (
            "redis_sentinels and redis_master, and that this node may reach the sentinels' and the "
            "primary's ports"
            if settings.redis_sentinels
            else "redis_url and that this node may reach its port"
        )
        return Check(
            "redis",
            FAIL,
            f"cannot reach Redis at {where}: {exc}",
            f"start Redis (7.0 or newer); check {reach}",
        ), None
    except redis.RedisError as exc:
        return Check("redis", FAIL, f"{where} as {as_user}: {exc}", "fleet needs Redis 7.0 or newer"), None
    info = hello if isinstance(hello, dict) else dict(zip(hello[::2], hello[1::2], strict=True))
    version = str(info.get("version", "?"))
    found = f"Redis {version} at {where}, as user {as_user}"
    if not version[:1].isdigit() or int(version.split(".")[0]) < 7:
        return Check("redis", WARN, found, "fleet needs Redis 7.0 or newer"), client
    return Check("redis", OK, found), client


def redis_clock(client: redis.Redis, probe_key: str) -> float:
    """Redis' clock, unix seconds: ``TIME``, or where the agent's ACL user may not run it, from when
    Redis expires a key it was told to keep 60 s (``PEXPIRETIME``, Redis 7.0)."""
    try:
        seconds, micros = client.time()
        return seconds + micros / 1e6
    except redis.exceptions.NoPermissionError:
        pipe = client.pipeline(transaction=True)
        pipe.set(probe_key, "1", px=60_000)
        pipe.execute_command("PEXPIRETIME", probe_key)  # type: ignore[no-untyped-call]
        pipe.delete(probe_key)
        _, expires_ms, _ = pipe.execute()
        return (int(expires_ms) - 60_000) / 1000


def clock_check(before: float, redis_now: float, after: float, fence_margin_s: float) -> Check:
    """This node's clock against Redis' (read between ``before`` and ``after`` on this node's).

    fleet's leases are Redis TTLs and the agent fences its jobs on its monotonic clock, so skew does
    not break fencing. But the times an agent writes (heartbeats, job starts, the STARTING deadline)
    are read against the controller's clock (a job's ``started_at`` says when it may be preempted):
    a skew above ``agent.fence_margin_s`` (2 s), the finest timing fleet keeps, makes those wrong by
    more than fleet's own slack, so it fails; above 0.5 s it warns. Only the part of the skew the
    round trip cannot explain counts."""
    skew = (before + after) / 2 - redis_now
    slack = (after - before) / 2
    certain = max(0.0, abs(skew) - slack)
    way = "ahead of" if skew > 0 else "behind"
    found = f"this node's clock is {abs(skew):.3f} s {way} Redis' (±{slack:.3f} s)"
    ntp = (
        "sync the clocks: run NTP (chrony or systemd-timesyncd) here and on Redis' host; "
        "timedatectl says whether a clock is synchronised"
    )
    if certain > fence_margin_s:
        return Check("clock", FAIL, f"{found}, over agent.fence_margin_s ({fence_margin_s:g} s)", ntp)
    if certain > SKEW_WARN_S:
        return Check("clock", WARN, f"{found}, over {SKEW_WARN_S:g} s", ntp)
    return Check("clock", OK, found)
