"""``/v1/history``: accounting, as Slurm's ``sacct``/``sreport``: what ended jobs used, per tenant,
per user or per job, kept after retention deleted the jobs (``fleet.state.accounting``). A user
reads its own tenant's; operators and admins every tenant's (``tenant`` narrows it)."""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from typing import Annotated

from fastapi import APIRouter, Query

from fleet.api.deps import User, own, sees_all
from fleet.errors import SpecError
from fleet.models.usage import Grouping, History, UsageRow, aggregate
from fleet.state.accounting import AccountingStore

#: most jobs one ``by=job`` answer lists (the newest; ``truncated`` says when more ended)
MAX_JOBS = 100_000


def routes(accounting: AccountingStore) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/history")
    def history(
        who: User,
        since: float,
        until: float | None = None,
        tenant: str | None = None,
        user: str | None = None,
        by: Grouping = "user",
        limit: Annotated[int, Query(ge=1, le=MAX_JOBS)] = 1000,
    ) -> History:
        """Jobs that ended in [``since``, ``until``) (Unix times; ``until`` default now), summed per
        tenant or per tenant and user; ``by=job``: also the newest ``limit`` jobs themselves."""
        end = time.time() if until is None else until
        if end <= since:
            raise SpecError(f"until ({end:.0f}) is not after since ({since:.0f}): give an earlier since")
        if not sees_all(who):
            if tenant not in (None, who.tenant):
                own(who, tenant or "", f"the history of tenant {tenant!r}")
            tenant = who.tenant
        rows: Iterable[UsageRow] = (
            r
            for r in accounting.rows(since, end)
            if (tenant is None or r.tenant == tenant) and (user is None or r.user == user)
        )
        if by != "job":
            return History(since=since, until=end, by=by, usage=aggregate(rows, by))
        rows = list(rows)
        newest = heapq.nlargest(limit, rows, key=_newest)
        usage = aggregate(rows, "user")
        return History(since=since, until=end, by=by, usage=usage, jobs=newest, truncated=len(rows) > limit)

    return router


def _newest(row: UsageRow) -> tuple[float, str]:
    return (row.ended_at, row.id)
