"""Where queued jobs stand: the queue's order and its per-tenant index (``lua/lib/ranked.lua``).

Every script that queues or unqueues a job keeps ``<p>:jobs:queued`` scored by rank and each
tenant's ``<p>:queue:<tenant>`` in the same atomic step, so a job's place in its tenant's queue and
in the whole queue is a ZRANK: ``fleet show`` and the status page cost the same at 100,000 queued
jobs as at ten (reading every queued spec took seconds). The leader checks the index against the
queue at each full resync and repairs what differs (jobs stored by a version without it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from fleet.keys import Keys
from fleet.models import QueuePosition
from fleet.state.connection import load_scripts, translated

#: ids per ranked_position.lua / ranked_repair.lua call
BATCH = 1000
#: scores below it are a seq alone: a job queued by a version before the index (ranked.lua)
RANK_UNIT = 1 << 40


class RankIndex:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)

    @translated
    def positions(self, job_ids: Iterable[str]) -> dict[str, QueuePosition]:
        """Where each of these jobs stands; jobs not queued are left out."""
        ids = list(job_ids)
        out = {}
        for start in range(0, len(ids), BATCH):
            batch = ids[start : start + BATCH]
            found = self._scripts["ranked_position"](keys=[self.keys.queued], args=[self.keys.prefix, *batch])
            for job_id, row in zip(batch, found, strict=True):
                if row:
                    tenant, mine, of_tenant, overall, queued = row
                    out[job_id] = QueuePosition(
                        tenant=tenant, in_tenant=mine, tenant_queued=of_tenant, overall=overall, queued=queued
                    )
        return out

    @translated
    def heads(self, tenant: str | None, per_tenant: int) -> list[str]:
        """The first ``per_tenant`` queued jobs of each tenant (of ``tenant`` only, when given), each
        tenant's in rank order, tenants by name."""
        tenants = [tenant] if tenant is not None else sorted(self.redis.smembers(self.keys.queued_tenants))
        pipe = self.redis.pipeline(transaction=False)
        for name in tenants:
            pipe.zrange(self.keys.queued_in(name), 0, per_tenant - 1)
        return [job_id for ids in pipe.execute() for job_id in ids]

    @translated
    def backfill(self) -> int:
        """Once per Redis: put jobs stored before the per-tenant indexes into their tenant's listing
        (and give them the field the indexes read); how many it added. A marker key says it is done."""
        if self.redis.exists(self.keys.indexed):
            return 0
        added, cursor = 0, 0
        while True:
            cursor, entries = self.redis.zscan(self.keys.jobs, cursor, count=BATCH)
            if entries:
                ids = [job_id for job_id, _ in entries]
                added += int(self._scripts["backfill_tenants"](args=[self.keys.prefix, *ids]))
            if cursor == 0:
                break
        self.redis.set(self.keys.indexed, "1")
        return added

    @translated
    def repair(self) -> int:
        """Rank what the queue holds unranked, and make the tenants' queues agree with it when their
        sizes do not add up to the queue's; how many jobs that changed. Costs a count per tenant
        when all is well (every full resync)."""
        k = self.keys
        fixed = self._fix("", self.redis.zrangebyscore(k.queued, "-inf", f"({RANK_UNIT}"))
        tenants = sorted(self.redis.smembers(k.queued_tenants))
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.zcard(k.queued_in(tenant))
        if sum(pipe.execute()) == self.redis.zcard(k.queued):
            return fixed
        for tenant in tenants:
            fixed += self._fix(tenant, self.redis.zdiff([k.queued_in(tenant), k.queued]))
        return fixed + self._fix("", self.redis.zdiff([k.queued, *map(k.queued_in, tenants)]))

    def _fix(self, tenant: str, ids: list[str]) -> int:
        fixed = 0
        for start in range(0, len(ids), BATCH):
            batch = ids[start : start + BATCH]
            fixed += int(
                self._scripts["ranked_repair"](
                    keys=[self.keys.queued], args=[self.keys.prefix, tenant, *batch]
                )
            )
        return fixed
