"""The pending queue, kept in memory by the leader and updated from events: jobs grouped by shape.

A pass walks the shapes' best jobs in rank order (priority, then submission) through a heap of
heads, so it costs about (placements x log shapes) + (blocked shapes x nodes), not jobs x nodes:
once a shape's best job fits nowhere, no later job of that shape can fit in the same pass (a pass
only takes capacity), so the whole shape waits with one reason. Jobs in their retry backoff sit
in a heap by ``not_before`` until due. Waiting reasons are returned only where they changed, and
never hold a countdown (the deadline is on the job; ``fleet show`` renders the countdown).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping

from fleet.scheduler.capacity import Capacity
from fleet.scheduler.snapshot import PendingJob, Plan, Shape

BACKOFF = "waiting out its retry backoff"
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
        if job is None or job_id not in self._in_shape:
            return job  # a delayed entry is dropped lazily when it comes due
        self._in_shape.discard(job_id)
        entries = self._shapes.get(job.shape, [])
        entry = (_key(job), job.id)
        i = bisect.bisect_left(entries, _desc(entry), key=_desc)
        if i < len(entries) and entries[i] == entry:
            del entries[i]
        return job

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
        return {shape[5] for shape, entries in self._shapes.items() if entries and shape[5]}

    def schedule(self, capacity: Capacity, now: float, room: Mapping[str, int] | None = None) -> Plan:
        """Place what fits, best-ranked first; the placed jobs leave the queue. ``room``: how many
        more tasks each array with a ``max_running`` may have on nodes (absent: no limit)."""
        plan = Plan()
        left = dict(room or {})
        self._promote(now)
        heads = [(entries[-1][0], shape) for shape, entries in self._shapes.items() if entries]
        heapq.heapify(heads)
        while heads:
            _, shape = heapq.heappop(heads)
            entries = self._shapes[shape]
            job = self.jobs[entries[-1][1]]
            if job.array is not None and left.get(job.array, 1) <= 0:
                self._give_reason(shape, f"array {job.array} has its max_running tasks on nodes", plan)
                continue
            placements = capacity.place(job)
            if placements is None:
                why, later = capacity.explain(job)
                capacity.reserve_for(job, later)
                self._give_reason(shape, why, plan)
                continue
            plan.placements.extend(placements)
            if job.array is not None and job.array in left:
                left[job.array] -= 1
            entries.pop()
            self._in_shape.discard(job.id)
            del self.jobs[job.id]
            self.reasons.pop(job.id, None)
            if entries:
                heapq.heappush(heads, (entries[-1][0], shape))
        for shape in list(self._shapes):
            if not self._shapes[shape]:
                self._forget_shape(shape)
        self._give_backoff_reasons(plan)
        return plan

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
