"""What the API reads, on Redis: jobs, arrays, the queue and where each job stands in it, logs,
histories, nodes and versions. Nothing here writes (the status pages are served from it alone)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fleet.errors import JobTimeout, NotFound, SpecError
from fleet.models import (
    Event,
    FleetVersions,
    Job,
    JobArray,
    JobState,
    LogLine,
    Node,
    QueuedJob,
    QueuePosition,
    RedisStatus,
    check_job_id,
)
from fleet.state import Stores
from fleet.state.redisinfo import RedisWatch
from fleet.versions import API, CONTROLLER, VERSION, mixed


def known_id(job_id: str) -> str:
    """``job_id`` if it could name a job; else :class:`NotFound` (it never reaches a Redis key)."""
    try:
        return check_job_id(job_id)
    except SpecError:
        raise NotFound(f"no job {job_id!r}: not a valid job id") from None


class Queries:
    """The fleet's reads, on the stores of one Redis client."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self._jobs, self._nodes = stores.jobs, stores.nodes
        self._arrays, self._ranked = stores.arrays, stores.ranked
        self._redis_watch = RedisWatch(stores.redis, stores.keys, stores.settings)

    @property
    def redis(self) -> Any:
        """The state DB's client (the API's token store shares it)."""
        return self.stores.redis

    # -- jobs --------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        return self._jobs.get(known_id(job_id))

    def array(self, array_id: str) -> JobArray:
        """A job array with its tasks counted by state."""
        return self._arrays.get(known_id(array_id))

    def listing(
        self,
        state: JobState | str | None = None,
        limit: int = 100,
        tenant: str | None = None,
        owner: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[Job | JobArray]:
        """Jobs newest first, each job array as one entry with its tasks counted by state (what
        ``fleet jobs`` shows); with ``state``, the jobs in it and the arrays with a task in it; with
        ``tenant``, ``owner`` or ``labels``, only those that have them."""
        wanted = JobState.parse(state)
        return _matching(
            lambda n: self._arrays.listing(wanted, n, tenant), limit, Filter(tenant, owner, labels)
        )

    def jobs(
        self,
        state: JobState | str | None = None,
        limit: int = 1000,
        tenant: str | None = None,
        owner: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[Job]:
        wanted = JobState.parse(state)
        return _matching(
            lambda n: self._jobs.list_jobs(wanted, n, tenant), limit, Filter(tenant, owner, labels)
        )

    def quarantined_jobs(self) -> dict[str, str]:
        """Jobs whose stored record cannot be read (id -> why), set aside by the controller."""
        return self._jobs.quarantined()

    def position(self, job_id: str) -> QueuePosition | None:
        """Where the job stands in the queue; None unless it is QUEUED (``fleet.state.ranked``)."""
        return self._ranked.positions([job_id]).get(job_id)

    def queue(self, tenant: str | None = None, per_tenant: int = 100) -> list[QueuedJob]:
        """QUEUED jobs by tenant, each tenant's in rank order (priority, then submission) with where
        each stands; the first ``per_tenant`` of each tenant (``tenant``: only that one's)."""
        ids = self._ranked.heads(tenant, per_tenant)
        where = self._ranked.positions(ids)
        jobs = {j.id: j for j in self._jobs.get_many([i for i in ids if i in where])}
        return [QueuedJob(job=jobs[i], position=where[i]) for i in ids if i in jobs]

    def on_nodes(self, tenant: str | None = None) -> list[Job]:
        """Jobs bound to a node (SCHEDULED, STARTING, RUNNING), longest there first; with ``tenant``,
        only that tenant's."""
        jobs = [j for j in self._jobs.read_on_nodes().jobs if tenant is None or j.spec.tenant == tenant]
        return sorted(jobs, key=lambda j: (j.started_at or j.state_since, j.seq))

    def history(self, job_id: str) -> list[Event]:
        self.get(job_id)
        return self._jobs.history(job_id)

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is final; raise :class:`JobTimeout` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = "0"
        while True:
            job = self._jobs.get(job_id)
            if job.state.final:
                return job
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JobTimeout(f"job {job_id} still {job.state} after {timeout:g}s")
            cursor = self._jobs.wait_event(job_id, cursor, max(1, int(min(left, 1.0) * 1000)))

    def watched_job(self, job_id: str) -> tuple[Job, dict[str, str]]:
        """The job, and the stream of its changes with where it stood before the job was read: a
        change after this read lies past that cursor (what the API's waits watch)."""
        cursor = self._jobs.last_event(known_id(job_id))
        return self.get(job_id), {self._jobs.keys.events(job_id): cursor}

    def watched_logs(
        self, job_id: str, attempt: int, rank: int, after: str
    ) -> tuple[Job, list[LogLine], dict[str, str]]:
        """One step of a followed log: the job, the attempt's lines past ``after`` (read after the job,
        so every line of an attempt seen over is among them), and the streams to watch for the next
        step with where each stands (the job's changes, the attempt's lines)."""
        job, cursors = self.watched_job(job_id)
        lines = self._jobs.read_logs(job_id, attempt, after, rank=rank)
        cursors[self._jobs.keys.logs(job_id, attempt, rank)] = lines[-1].id if lines else after
        return job, lines, cursors

    def logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> list[LogLine]:
        """Log lines of ``attempt`` (default: the latest); of member ``rank`` of a multi-node job."""
        job = self.get(job_id)
        return self._jobs.read_logs(job_id, known_attempt(job, attempt), rank=rank)

    def follow_logs(
        self,
        job_id: str,
        attempt: int | None = None,
        poll_s: float = 1.0,
        rank: int = 0,
        allowed: Callable[[], bool] | None = None,
    ) -> Iterator[LogLine]:
        """Yield log lines as they arrive until the attempt is over and its stream drained, or until
        ``allowed`` (asked before each read, at least every ``poll_s``) says the reader may no longer
        read them (its token was revoked)."""
        job = self.get(job_id)
        attempt = known_attempt(job, attempt)
        cursor = "0"
        while allowed is None or allowed():
            lines = self._jobs.read_logs(job_id, attempt, cursor, block_ms=int(poll_s * 1000), rank=rank)
            yield from lines
            if lines:
                cursor = lines[-1].id
                continue
            if attempt_over(self._jobs.get(job_id), attempt):
                return

    # -- nodes -------------------------------------------------------------------------

    def check_tenant(self, tenant: str) -> None:
        """:class:`SpecError` for a tenant nobody created (see :meth:`TenantStore.check`)."""
        self.stores.tenants.check(tenant)

    def nodes(self) -> list[Node]:
        return self._nodes.all()

    def most_gpus(self) -> int:
        """The most GPUs one live node has: a job asking for more stays QUEUED until such a node joins."""
        return self._nodes.most_gpus()

    def versions(self, api: str = VERSION) -> FleetVersions:
        """Which release the leading controller and each live node's agent run, with ``api`` (the
        API server asking), and whether they differ."""
        controller, nodes = self._nodes.versions()
        services = {API: api, **({} if controller is None else {CONTROLLER: controller}), **nodes}
        return FleetVersions(api=api, controller=controller, nodes=nodes, mixed=mixed(services))

    def redis_status(self) -> RedisStatus:
        """Which Redis is primary, its replicas' lag, the failovers seen: read at most every few
        seconds by this process, however many ask (:class:`fleet.state.redisinfo.RedisWatch`)."""
        return self._redis_watch.status()

    def quarantined_nodes(self) -> dict[str, str]:
        """Nodes whose stored record cannot be read (name -> why); they get no jobs until it reads."""
        return self._nodes.read_all().quarantined

    def node(self, name: str) -> Node:
        return self._nodes.get(name)


def known_attempt(job: Job, attempt: int | None) -> int:
    """``attempt`` of the job (None: its latest); NotFound naming the attempts it has if it has no such."""
    latest = max(job.attempt, 1)  # a job not started yet: attempt 1, with no lines so far
    if attempt is None:
        return latest
    if attempt > latest:
        has = f"has attempts 1-{latest}" if latest > 1 else "has one attempt, 1"
        raise NotFound(f"job {job.id} {has}: no attempt {attempt} (see `fleet show {job.id}`)")
    return attempt


ListingItem = TypeVar("ListingItem", Job, Job | JobArray)


@dataclass(frozen=True)
class Filter:
    """What a listing keeps: a tenant's, a user's, those carrying all of some labels (None: any)."""

    tenant: str | None = None
    owner: str | None = None
    labels: dict[str, str] | None = None

    def keeps(self, entry: Job | JobArray) -> bool:
        return (
            self.tenant in (None, entry.spec.tenant)
            and self.owner in (None, entry.owner)
            and all(entry.spec.labels.get(k) == v for k, v in (self.labels or {}).items())
        )


def _matching(read: Callable[[int], list[ListingItem]], limit: int, keep: Filter) -> list[ListingItem]:
    """The first ``limit`` entries ``read(n)`` gives that ``keep`` keeps.

    Reads ever larger prefixes of the listing (a tenant's has its own, ``<p>:jobs:of:<tenant>``): a
    user's or a label's view still reads the tenant's other jobs on the way.
    """
    if keep == Filter():
        return read(limit)
    n = limit
    while True:
        entries = read(n)
        kept = [e for e in entries if keep.keeps(e)]
        if len(kept) >= limit or len(entries) < n:
            return kept[:limit]
        n *= 4


def attempt_over(job: Job, attempt: int) -> bool:
    """Whether ``attempt`` of ``job`` writes no more lines: a later one began, the job is final, or the
    attempt ended and the job waits in the queue for the next."""
    return (
        job.attempt > attempt or job.state.final or (job.attempt == attempt and job.state == JobState.QUEUED)
    )
