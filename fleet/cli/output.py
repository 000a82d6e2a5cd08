"""Rendering for the CLI: aligned tables for people, ``-o json`` for scripts."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from fleet.models import Tenant

GiB = 1 << 30


def emit_json(data: Any) -> None:
    """JSON for scripts; every ``*_at`` time (unix seconds) gets an ISO 8601 twin, ``*_at_iso``."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    json.dump(_with_iso(data), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _with_iso(data: Any) -> Any:
    if isinstance(data, list):
        return [_with_iso(d) for d in data]
    if not isinstance(data, dict):
        return data
    out = {k: _with_iso(v) for k, v in data.items()}
    for key, value in data.items():
        if (key.endswith("_at") or key == "at") and isinstance(value, int | float) and value > 0:
            out[f"{key}_iso"] = iso(value)
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers], *([("-" if c is None else str(c)) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


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


def guarantee(tenant: Tenant) -> str:
    """'8 GPUs', or with CPU and memory guarantees '8 GPUs, 64 CPUs, 256GiB'."""
    parts = [f"{tenant.guaranteed_gpus} GPU{'s' if tenant.guaranteed_gpus != 1 else ''}"]
    if tenant.guaranteed_cpus:
        parts.append(f"{tenant.guaranteed_cpus:g} CPUs")
    if tenant.guaranteed_memory:
        parts.append(size(tenant.guaranteed_memory))
    return ", ".join(parts)
