"""The pending queue, kept in memory by the leader and updated from events: jobs grouped by shape.

Each tenant's jobs form their own shapes. A pass gives the turn to the tenant fair share puts
first (``FairShare.key``), which places its best job (priority, then submission) from a heap of its
shapes' heads; the tenant's place in the order is then worked out again from what it holds now, so
a pass costs about (placements x (log shapes + log tenants)) + (blocked shapes x nodes), not jobs x
nodes: once a shape's best job fits nowhere, no later job of that shape can fit in the same pass (a
pass only takes capacity), so the whole shape waits with one reason. A tenant over its share still
places once the others have nothing that fits (backfill), except on nodes reserved for a blocked
larger job. Jobs in their retry backoff sit in a heap by ``not_before`` until due. Waiting reasons
are returned only where they changed, and never hold a countdown (the deadline is on the job;
``fleet show`` renders the countdown).
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Iterable, Mapping

from fleet.scheduler.capacity import Capacity
from fleet.scheduler.fairshare import FairShare
from fleet.scheduler.snapshot import ARRAY, TENANT, PendingJob, Placement, Plan, Shape

BACKOFF = "waiting out its retry backoff"
#: a shape that found no room names its best few jobs in ``Plan.blocked``: a tenant short of its
#: guarantee by several GPUs preempts for several jobs in one pass, not one job per pass
BLOCKED_PER_SHAPE = 4
Entry = tuple[tuple[int, int], str]


class PendingQueue:
    def __init__(self, jobs: Iterable[PendingJob] = (), reasons: dict[str, str] | None = None) -> None:
        self.jobs: dict[str, PendingJob] = {}
        #: the reason each job holds in the store (so unchanged ones are not rewritten)
        self.reasons: dict[str, str] = {}
        #: per shape, (rank, id) sorted worst first: the best job is at the end, popped in O(1)
        self._shapes: dict[Shape, list[Entry]] = {}
        self._delayed: list[tuple[float, str]] = []
        self._in_shape: set[str] = set()
        self._fresh_delayed: list[str] = []
        #: per shape, the reason its jobs were last given, and the jobs added since
        self._shape_reason: dict[Shape, str] = {}
        self._fresh: dict[Shape, list[str]] = {}
        #: per tenant: jobs queued (backoff included), and the GPUs they ask (its unmet demand)
        self.counts: Counter[str] = Counter()
        self.demand: Counter[str] = Counter()
        self.add_many(jobs, reasons or {})

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs

    # -- changes ----------------------------------------------------------------------

    def add(self, job: PendingJob, reason: str = "") -> None:
        self.add_many([job], {job.id: reason})

    def add_many(self, jobs: Iterable[PendingJob], reasons: dict[str, str]) -> int:
        """Add or update jobs; how many were new or changed."""
        touched: set[Shape] = set()
        changed = 0
        for job in jobs:
            if self.jobs.get(job.id) == job:
                continue
            changed += 1
            self.discard(job.id)
            self.jobs[job.id] = job
            self._count(job, 1)
            self.reasons[job.id] = reasons.get(job.id, "")
            if job.not_before:
                heapq.heappush(self._delayed, (job.not_before, job.id))
                self._fresh_delayed.append(job.id)
            else:
                self._shapes.setdefault(job.shape, []).append((_key(job), job.id))
                self._fresh.setdefault(job.shape, []).append(job.id)
                self._in_shape.add(job.id)
                touched.add(job.shape)
        for shape in touched:
            self._shapes[shape].sort(reverse=True)
        return changed

    def discard(self, job_id: str) -> PendingJob | None:
        job = self.jobs.pop(job_id, None)
        self.reasons.pop(job_id, None)
        if job is not None:
            self._count(job, -1)
        if job is None or job_id not in self._in_shape:
            return job  # a delayed entry is dropped lazily when it comes due
        self._in_shape.discard(job_id)
        entries = self._shapes.get(job.shape, [])
        entry = (_key(job), job.id)
        i = bisect.bisect_left(entries, _desc(entry), key=_desc)
        if i < len(entries) and entries[i] == entry:
            del entries[i]
        return job

    def _count(self, job: PendingJob, sign: int) -> None:
        self.counts[job.tenant] += sign
        held = job.held_by or job.dependent  # no demand until released, or its dependencies ended
        self.demand[job.tenant] += 0 if held else sign * job.gpus
        if not self.counts[job.tenant]:
            del self.counts[job.tenant], self.demand[job.tenant]

    def _promote(self, now: float) -> None:
        """Move jobs whose backoff ended into their shape."""
        while self._delayed and self._delayed[0][0] <= now:
            not_before, job_id = heapq.heappop(self._delayed)
            job = self.jobs.get(job_id)
            if job is not None and job.not_before == not_before and job_id not in self._in_shape:
                self._in_shape.add(job_id)
                entries = self._shapes.setdefault(job.shape, [])
                bisect.insort(entries, (_key(job), job.id), key=_desc)
                self._fresh.setdefault(job.shape, []).append(job.id)

    def next_due(self) -> float:
        """When the earliest backoff ends (inf when none)."""
        while self._delayed and self._delayed[0][1] not in self.jobs:
            heapq.heappop(self._delayed)
        return self._delayed[0][0] if self._delayed else float("inf")

    # -- a pass -----------------------------------------------------------------------

    def arrays(self) -> set[str]:
        """Arrays with a ``max_running`` limit that have tasks waiting here."""
        return {shape[ARRAY] for shape, entries in self._shapes.items() if entries and shape[ARRAY]}

    def schedule(
        self,
        capacity: Capacity,
        now: float,
        room: Mapping[str, int] | None = None,
        fair: FairShare | None = None,
        held: Mapping[str, set[str]] | None = None,
    ) -> Plan:
        """Place what fits, tenants in fair-share order, each tenant's best-ranked first; the placed
        jobs leave the queue. ``room``: how many more tasks each array with a ``max_running`` may have
        on nodes (absent: no limit). ``fair``: the tenants' policies and holdings (absent: every
        tenant the default policy, holding nothing). ``held``: GPUs being freed by a preemption, by the
        job they are for: it is tried first, and nobody else takes them meanwhile."""
        plan = Plan()
        left = dict(room or {})
        fair = fair if fair is not None else FairShare()
        self._promote(now)
        self._place_held(capacity, fair, held or {}, left, plan)
        heads: dict[str, list[tuple[tuple[int, int], Shape]]] = {}
        for shape, entries in self._shapes.items():
            if entries:
                heads.setdefault(shape[TENANT], []).append((entries[-1][0], shape))
        for tenant_heads in heads.values():
            heapq.heapify(tenant_heads)
        turns = [(fair.key(tenant), tenant) for tenant in heads]
        heapq.heapify(turns)
        while turns:
            _, tenant = heapq.heappop(turns)
            tenant_heads = heads[tenant]
            _, shape = heapq.heappop(tenant_heads)
            entries = self._shapes[shape]
            if self._turn(self.jobs[entries[-1][1]], capacity, fair, left, plan) and entries:
                heapq.heappush(tenant_heads, (entries[-1][0], shape))
            if tenant_heads:  # its holdings may have grown: its place in the order is worked out again
                heapq.heappush(turns, (fair.key(tenant), tenant))
        for shape in list(self._shapes):
            if not self._shapes[shape]:
                self._forget_shape(shape)
        self._give_backoff_reasons(plan)
        return plan

    def _turn(
        self, job: PendingJob, capacity: Capacity, fair: FairShare, left: dict[str, int], plan: Plan
    ) -> bool:
        """Place the best job of its shape, or give the whole shape the reason it waits; True if placed."""
        held_back = job.hold or fair.limit(job)
        if not held_back and job.array is not None and left.get(job.array, 1) <= 0:
            held_back = f"array {job.array} has its max_running tasks on nodes"
        if held_back:
            self._give_reason(job.shape, held_back, plan)
            return False
        placements = capacity.place(job)
        if placements is None:
            why, later = capacity.explain(job)
            capacity.reserve_for(job, later)
            self._give_reason(job.shape, why, plan)
            entries = self._shapes[job.shape]
            plan.blocked.extend(job_id for _, job_id in reversed(entries[-BLOCKED_PER_SHAPE:]))
            return False
        self._placed(job, placements, fair, left, plan)
        return True

    def _placed(
        self, job: PendingJob, placements: list[Placement], fair: FairShare, left: dict[str, int], plan: Plan
    ) -> None:
        plan.placements.extend(placements)
        plan.jobs[job.id] = job
        fair.add(job, len(placements))
        if job.array is not None and job.array in left:
            left[job.array] -= 1
        self.discard(job.id)

    def _place_held(
        self,
        capacity: Capacity,
        fair: FairShare,
        held: Mapping[str, set[str]],
        left: dict[str, int],
        plan: Plan,
    ) -> None:
        """Jobs that preempted others go first, wherever they fit; the GPUs of those still waiting
        are withheld from the rest of the pass."""
        waiting: set[str] = set()
        for job_id, gpus in held.items():
            job = self.jobs.get(job_id)
            if job is None or job_id not in self._in_shape or job.hold:
                continue
            room = left.get(job.array, 1) if job.array is not None else 1
            placements = None if fair.limit(job) or room <= 0 else capacity.place(job)
            if placements is None:
                waiting |= gpus
            else:
                self._placed(job, placements, fair, left, plan)
        capacity.withhold(waiting)

    def _give_reason(self, shape: Shape, why: str, plan: Plan) -> None:
        """Only jobs whose stored reason differs: all of them when the shape's reason changed,
        else only those added since the last pass."""
        if self._shape_reason.get(shape) == why:
            ids: Iterable[str] = self._fresh.get(shape, [])
        else:
            ids = [job_id for _, job_id in self._shapes[shape]]
        for job_id in ids:
            if job_id in self.jobs and self.reasons.get(job_id) != why:
                plan.waiting[job_id] = why
                self.reasons[job_id] = why
        self._shape_reason[shape] = why
        self._fresh[shape] = []

    def _give_backoff_reasons(self, plan: Plan) -> None:
        for job_id in self._fresh_delayed:
            if job_id in self.jobs and job_id not in self._in_shape and self.reasons.get(job_id) != BACKOFF:
                plan.waiting[job_id] = BACKOFF
                self.reasons[job_id] = BACKOFF
        self._fresh_delayed = []

    def _forget_shape(self, shape: Shape) -> None:
        del self._shapes[shape]
        self._shape_reason.pop(shape, None)
        self._fresh.pop(shape, None)


def _key(job: PendingJob) -> tuple[int, int]:
    return job.rank


def _desc(entry: Entry) -> tuple[tuple[int, int], str]:
    """Sort key under which a worst-first list is ascending (for bisect)."""
    (neg_priority, seq), job_id = entry
    return ((-neg_priority, -seq), job_id)
