"""Accounting rows in Redis: one per ended job, written by the scripts that end jobs
(``lua/lib/accounting.lua``), kept by day for ``accounting_retention_s`` after retention deleted the
jobs themselves; read here for ``fleet history``, trimmed by the leader."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import redis
from pydantic import ValidationError

from fleet.errors import NotLeader
from fleet.keys import Keys
from fleet.log import event
from fleet.models.usage import UsageRow
from fleet.state.connection import load_scripts, translated

log = logging.getLogger("fleet.state")
#: a day's rows, as the scripts key them: floor(end time / DAY_S)
DAY_S = 86400
#: rows read per HSCAN call, days deleted per trim call
SCAN_COUNT = 1000
TRIM_DAYS = 100


class AccountingStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)

    def rows(self, since: float, until: float) -> Iterator[UsageRow]:
        """Every job that ended in [since, until), a day's rows at a time (unordered). A row that
        cannot be read is left out and logged, never an error for the reader."""
        for day in self._days(since, until):
            yield from (row for row in self._day(day) if since <= row.ended_at < until)

    @translated
    def _days(self, since: float, until: float) -> list[int]:
        found = self.redis.zrangebyscore(self.keys.acct_days, int(since // DAY_S), int(until // DAY_S))
        return [int(day) for day in found]

    @translated
    def _day(self, day: int) -> list[UsageRow]:
        rows = []
        for job_id, text in self.redis.hscan_iter(self.keys.acct_day(day), count=SCAN_COUNT):
            try:
                rows.append(UsageRow.model_validate(json.loads(text)))
            except (ValueError, ValidationError) as exc:
                event(log, "accounting_row_unreadable", job=job_id, day=day, error=str(exc)[:200])
        return rows

    @translated
    def trim(self, now: float, keep_s: float, leader: str) -> int:
        """Delete the rows of days that ended more than ``keep_s`` before ``now`` (leader only); the
        number of days deleted."""
        first_kept = int((now - keep_s) // DAY_S)
        k, deleted = self.keys, 0
        while True:
            args = [leader, k.prefix, first_kept, TRIM_DAYS]
            code = int(self._scripts["trim_accounting"](keys=[k.acct_days, k.leader], args=args))
            if code == -2:
                raise NotLeader("trim of accounting rows refused: another controller holds the leader lease")
            deleted += code
            if code < TRIM_DAYS:
                return deleted
