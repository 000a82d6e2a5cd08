"""How fleet writes times, sizes and counts for people: one module for the CLI and the status page."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleet.models import JobState

if TYPE_CHECKING:
    from fleet.models import Job, RedisStatus, ReplicaLag, Tenant

GiB = 1 << 30


def ago(at: float | None, now: float | None = None) -> str:
    if not at:
        return "-"
    seconds = (now or time.time()) - at
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def took(seconds: float) -> str:
    """A duration as people write it: ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(at: float | None, now: float | None = None) -> str:
    """A time of day (today), or the date and time (earlier)."""
    if not at:
        return "-"
    same_day = time.localtime(at)[:3] == time.localtime(now or time.time())[:3]
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M", time.localtime(at))


def iso(at: float) -> str:
    """ISO 8601 in UTC, to the millisecond: ``2026-11-22T07:25:04.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"


def stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def size(n: int | None) -> str:
    return "-" if not n else f"{n / GiB:.0f}GiB" if n >= GiB else f"{n >> 20}MiB"


def nbytes(n: int) -> str:
    """A byte count, exact below a KiB: ``512 B``, ``3.5 KiB``, ``12.0 MiB``, ``2.0 GiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while n >= 1024 ** (power + 1) and power < len(units) - 1:
        power += 1
    return f"{n} B" if power == 0 else f"{n / 1024**power:.1f} {units[power]}"


def bar(fraction: float, width: int = 30) -> str:
    """``[#########.....................]``: a bar for plain text."""
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def countdown(job: Job, now: float) -> str:
    """A queued job's wait before its next attempt (stored reasons hold no countdown), or ""."""
    left = job.not_before - now
    return f"next attempt in {left:.0f}s" if job.state == JobState.QUEUED and left > 0 else ""


def guarantee(tenant: Tenant) -> str:
    """'8 GPUs', or with CPU and memory guarantees '8 GPUs, 64 CPUs, 256GiB'."""
    parts = [f"{tenant.guaranteed_gpus} GPU{'s' if tenant.guaranteed_gpus != 1 else ''}"]
    if tenant.guaranteed_cpus:
        parts.append(f"{tenant.guaranteed_cpus:g} CPUs")
    if tenant.guaranteed_memory:
        parts.append(size(tenant.guaranteed_memory))
    return ", ".join(parts)


def redis_line(status: RedisStatus, now: float) -> str:
    """The status as one line: ``redis: primary 10.0.0.1:6379, 2 replicas (lag at most 0 B, 0 s),
    3 of 3 sentinels agree; 1 failover, the last 5m ago: ...``."""
    if status.error:
        return f"redis: unknown ({status.error})"
    line = f"redis: primary {status.primary}, " + _replicas(status.replicas)
    if status.sentinels:
        line += f", {status.sentinels_agreeing} of {status.sentinels} sentinels agree"
    last = status.last_failover
    if last is not None:
        count = f"{status.failovers} failover{'s' if status.failovers != 1 else ''}"
        line += (
            f"; {count}, the last {ago(last.at, now)}: {last.previous} -> {last.primary}, "
            f"services cut off {last.cut_off_s:g} s"
        )
    return line


def _replicas(replicas: list[ReplicaLag]) -> str:
    if not replicas:
        return "no replicas"
    syncing = sum(1 for r in replicas if r.state != "online")
    most_bytes, most_s = max(r.lag_bytes for r in replicas), max(r.lag_s for r in replicas)
    count = f"{len(replicas)} replica{'s' if len(replicas) != 1 else ''}"
    text = f"{count} (lag at most {nbytes(most_bytes)}, {most_s} s"
    return text + (f"; {syncing} not yet in sync)" if syncing else ")")
