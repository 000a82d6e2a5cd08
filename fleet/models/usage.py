"""Accounting (``fleet history``): one row per ended job, kept after retention deletes the job, and
what they add up to per tenant or per user. The rows are written by the store's scripts as jobs end
(``fleet/state/lua/lib/accounting.lua``); here they are read, summed and their periods parsed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from fleet.errors import SpecError
from fleet.models.base import _LAZY

Grouping = Literal["tenant", "user", "job"]
GROUPINGS: tuple[Grouping, ...] = ("tenant", "user", "job")
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*\Z", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UsageRow(BaseModel):
    """An ended job, as accounting keeps it: who ran it, how it ended, what its attempts used."""

    model_config = _LAZY

    id: str
    tenant: str
    #: the user whose token submitted it ('' for jobs stored without the API)
    user: str = ""
    name: str = ""
    state: str
    #: GPUs it asked for (an elastic job: its last size)
    gpus: int = 0
    attempts: int = 0
    submitted_at: float = 0.0
    #: when its first attempt started running; None if none ever ran
    started_at: float | None = None
    ended_at: float
    #: seconds its attempts ran, and those seconds times their GPUs and granted CPUs, summed over
    #: every attempt (requeues and resizes included)
    run_s: float = 0.0
    gpu_s: float = 0.0
    cpu_s: float = 0.0


class Usage(BaseModel):
    """What the ended jobs of one tenant (``user`` None) or of one user of a tenant used."""

    model_config = _LAZY

    tenant: str
    user: str | None = None
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    run_s: float = 0.0
    gpu_s: float = 0.0
    cpu_s: float = 0.0


class History(BaseModel):
    """``GET /v1/history``: jobs that ended in [since, until), summed per ``by`` (``usage``); with
    ``by`` = job, the jobs themselves too (``jobs``, the newest ``limit``; ``truncated`` if more)."""

    model_config = _LAZY

    since: float
    until: float
    by: Grouping
    usage: list[Usage] = Field(default_factory=list)
    jobs: list[UsageRow] = Field(default_factory=list)
    truncated: bool = False


def aggregate(rows: Iterable[UsageRow], by: Grouping) -> list[Usage]:
    """``rows`` summed per tenant (``by`` = tenant) or per tenant and user (else), most GPU-hours
    first, then by name."""
    groups: dict[tuple[str, str | None], Usage] = {}
    for row in rows:
        user = None if by == "tenant" else row.user
        usage = groups.setdefault((row.tenant, user), Usage(tenant=row.tenant, user=user))
        usage.jobs += 1
        usage.succeeded += row.state == "SUCCEEDED"
        usage.failed += row.state == "FAILED"
        usage.cancelled += row.state == "CANCELLED"
        usage.run_s += row.run_s
        usage.gpu_s += row.gpu_s
        usage.cpu_s += row.cpu_s
    return sorted(groups.values(), key=lambda u: (-u.gpu_s, u.tenant, u.user or ""))


def total(usage: Iterable[Usage]) -> Usage:
    """The sum of ``usage`` (tenant ``TOTAL``)."""
    out = Usage(tenant="TOTAL")
    for u in usage:
        out.jobs, out.succeeded = out.jobs + u.jobs, out.succeeded + u.succeeded
        out.failed, out.cancelled = out.failed + u.failed, out.cancelled + u.cancelled
        out.run_s, out.gpu_s, out.cpu_s = out.run_s + u.run_s, out.gpu_s + u.gpu_s, out.cpu_s + u.cpu_s
    return out


def parse_when(text: str, now: float, flag: str) -> float:
    """A point in time for ``--since``/``--until``: a span back from ``now`` (``30d``, ``12h``,
    ``2w``, ``90m``, ``45s``) or an ISO 8601 date or time (``2025-01-31``, ``2025-01-31T08:00``,
    local time unless it names a zone). :class:`SpecError` naming ``flag`` and the forms otherwise."""
    match = _AGO.match(text)
    if match:
        number, unit = match.groups()
        return now - float(number) * _UNIT_S[unit.lower()]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise SpecError(
            f"{flag} {text!r}: expected a span back from now (e.g. 30d, 12h, 2w, 90m) or an ISO date "
            "or time (e.g. 2025-01-31 or 2025-01-31T08:00)"
        ) from None
