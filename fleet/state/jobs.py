"""Jobs in Redis: create and read (changes of state: ``fleet.state.transitions``; logs:
``fleet.state.logs``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from fleet.errors import CorruptRecord, IdInUse, NotFound
from fleet.keys import Keys
from fleet.models import ON_NODE_STATES, Event, Job, JobArray, JobSpec, JobState, check_job_id
from fleet.state.connection import load_scripts, translated
from fleet.state.logs import JobLogs
from fleet.state.records import JobBatch, parse_array, parse_job, parse_tombstone
from fleet.state.transitions import JobTransitions


class JobStore(JobTransitions, JobLogs):
    """Jobs in Redis. Here: create and read; :class:`JobTransitions`: every change of state (fenced by
    the leader lease where a controller makes it); :class:`JobLogs`: their log streams."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)
        #: parsed spec of each array seen, by (array id, spec JSON)
        self._specs: dict[tuple[str, str], JobSpec] = {}

    # -- create and read ---------------------------------------------------------------

    @translated
    def create(self, job_id: str, spec: JobSpec, now: float, owner: str = "") -> bool:
        """Store a new QUEUED job; False when ``job_id`` already exists (idempotent submit).

        The id of a job deleted by retention is refused while its tombstone lasts: a new job by that
        name would inherit the old one's checkpoint directory until the agents' sweep removes it.
        """
        check_job_id(job_id)
        created = self._submit(job_id, spec, now, owner=owner)
        if created == -1:
            raise IdInUse(
                f"{self._missing(job_id)}; its id is free again once that is forgotten "
                "(tombstone_retention_s): choose another id"
            )
        if created == -2:
            raise IdInUse(f"job id {job_id!r} is the id of a job array; choose another id")
        self.replicated(f"the submit of job {job_id}")  # a repeated submit too: the first may not be
        return bool(created)

    @translated
    def create_many(self, jobs: list[tuple[str, JobSpec]], now: float, owner: str = "") -> list[int]:
        """Store many QUEUED jobs in one round trip (a batch submit, benchmarks, bulk loads), each in one
        atomic step; per job what ``submit.lua`` answered: 1 created, 0 the id held by a job, -1 by an
        expired job's tombstone, -2 by a job array."""
        for job_id, _ in jobs:
            check_job_id(job_id)
        pipe = self.redis.pipeline(transaction=False)
        for job_id, spec in jobs:
            self._submit(job_id, spec, now, pipe, owner)
        codes = [int(code) for code in pipe.execute()]
        self.replicated(f"the submit of {len(jobs)} job(s)")
        return codes

    @translated
    def holders(self, job_ids: list[str]) -> dict[str, str | None]:
        """What holds each id: "job", "expired" (a tombstone), "array", or None (it is free)."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(k.job(job_id))
            pipe.exists(k.tombstone(job_id))
            pipe.exists(k.array(job_id))
        found = pipe.execute()
        kinds = ("job", "expired", "array")
        out: dict[str, str | None] = {}
        for n, job_id in enumerate(job_ids):
            flags = found[3 * n : 3 * n + 3]
            out[job_id] = next((k for k, held in zip(kinds, flags, strict=True) if held), None)
        return out

    def _submit(self, job_id: str, spec: JobSpec, now: float, client: Any = None, owner: str = "") -> Any:
        k = self.keys
        keys = [
            k.job(job_id),
            k.seq,
            k.jobs,
            k.queued,
            k.jobs_in(JobState.QUEUED),
            k.tombstone(job_id),
            k.array(job_id),
        ]
        rank = f"{spec.priority} {spec.tenant}"
        call = "" if spec.call is None else spec.call.blob.removeprefix("sha256:")  # checked by the model
        args = [job_id, spec.model_dump_json(), now, "submitted", owner, rank, k.prefix, spec.tenant, call]
        return self._scripts["submit"](keys=keys, args=args, client=client)

    @translated
    def get(self, job_id: str) -> Job:
        """The job; :class:`JobExpired` (a NotFound) for one retention deleted, NotFound for no job."""
        raw = self.redis.hgetall(self.keys.job(job_id))
        if not raw:
            raise self._missing(job_id)
        try:
            return parse_job(raw, self.arrays([raw["array"]] if raw.get("array") else []))
        except CorruptRecord as exc:
            quarantined = self.redis.hget(self.keys.quarantined_jobs, job_id)
            if quarantined is not None:
                raise CorruptRecord(f"job {job_id} is quarantined: {quarantined}") from None
            raise CorruptRecord(f"the record of job {job_id} cannot be read: {exc}") from None

    def _missing(self, job_id: str) -> NotFound:
        tombstone = self.redis.get(self.keys.tombstone(job_id))
        if tombstone is not None:
            return parse_tombstone(job_id, tombstone)
        return NotFound(f"no job {job_id!r} (list jobs with `fleet jobs`)")

    @translated
    def arrays(self, array_ids: Iterable[str]) -> dict[str, JobArray]:
        """The records of these job arrays (without task counts) that exist and can be read; each
        spec is parsed once per process (an array's spec never changes)."""
        ids = sorted(set(array_ids))
        pipe = self.redis.pipeline(transaction=False)
        for array_id in ids:
            pipe.hgetall(self.keys.array(array_id))
        found = {}
        for array_id, raw in zip(ids, pipe.execute(), strict=True):
            if not raw:
                continue
            try:
                found[array_id] = parse_array(raw, self._specs.get((array_id, raw.get("spec", ""))))
            except CorruptRecord:
                continue  # its tasks are reported unreadable, with the reason, by parse_job
            if len(self._specs) > 4096:
                self._specs.clear()
            self._specs[array_id, raw["spec"]] = found[array_id].spec
        return found

    def get_many(self, job_ids: Iterable[str]) -> list[Job]:
        """The jobs that exist and can be read; unreadable ones are skipped (see ``read_many``)."""
        return self.read_many(job_ids).jobs

    @translated
    def read_many(self, job_ids: Iterable[str]) -> JobBatch:
        ids = list(job_ids)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        rows = pipe.execute()
        arrays = self.arrays({raw["array"] for raw in rows if raw.get("array")})
        batch = JobBatch()
        for job_id, raw in zip(ids, rows, strict=True):
            if not raw:
                continue
            try:
                batch.jobs.append(parse_job(raw, arrays))
            except CorruptRecord as exc:
                batch.corrupt[job_id] = str(exc)
        return batch

    @translated
    def states(self, job_ids: Iterable[str]) -> dict[str, JobState | None]:
        """Each job's state (None: no such job), in one round trip."""
        ids = sorted(set(job_ids))
        pipe = self.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), "state")
        return {i: JobState(s) if s else None for i, s in zip(ids, pipe.execute(), strict=True)}

    @translated
    def list_jobs(
        self, state: JobState | None = None, limit: int = 1000, tenant: str | None = None
    ) -> list[Job]:
        """Jobs newest first, optionally only those in ``state``, or of ``tenant``."""
        if state is None:
            return self.get_many(self.redis.zrevrange(self.keys.jobs_of(tenant), 0, limit - 1))
        return self.get_many(job_id for job_id, _ in self.newest_in(state, limit, tenant))

    @translated
    def newest_in(self, state: JobState, limit: int, tenant: str | None = None) -> list[tuple[str, int]]:
        """(id, seq) of the newest ``limit`` jobs in ``state`` (of ``tenant``), newest first."""
        keys = [self.keys.jobs_of(tenant), self.keys.jobs_in(state)]
        found = self._scripts["newest_in"](keys=keys, args=[limit])
        return [(found[i], int(found[i + 1])) for i in range(0, len(found), 2)]

    @translated
    def read_on_nodes(self) -> JobBatch:
        """Every job bound to a node (SCHEDULED, STARTING, RUNNING), whichever node that is."""
        return self.read_many(self.redis.sunion([self.keys.jobs_in(s) for s in ON_NODE_STATES]))

    @translated
    def read_launching(self) -> JobBatch:
        """Jobs placed and not yet running (SCHEDULED, STARTING): those with launch deadlines."""
        states = [self.keys.jobs_in(s) for s in (JobState.SCHEDULED, JobState.STARTING)]
        return self.read_many(self.redis.sunion(states))

    def queued(self) -> list[Job]:
        return self.read_queued().jobs

    @translated
    def read_queued(self) -> JobBatch:
        return self.read_many(self.redis.zrange(self.keys.queued, 0, -1))

    @translated
    def array_active_counts(self, array_ids: Iterable[str]) -> dict[str, int]:
        """How many tasks of each array are on nodes (SCHEDULED, STARTING, RUNNING) now: what
        ``max_running`` limits, which the scheduler enforces (the queue's array room). place_many.lua
        adds each task it places to the set it counts; transition.lua and quarantine_job.lua take
        tasks out of it as they leave the nodes."""
        ids = sorted(set(array_ids))
        pipe = self.redis.pipeline(transaction=False)
        for array_id in ids:
            pipe.scard(self.keys.array_active(array_id))
        return dict(zip(ids, map(int, pipe.execute()), strict=True))

    @translated
    def on_node(self, node: str) -> list[Job]:
        return self.get_many(self.redis.smembers(self.keys.node_jobs(node)))

    @translated
    def history(self, job_id: str) -> list[Event]:
        """Every transition, oldest first. The submit is not stored as an event (see submit.lua):
        it is the job's ``created_at``, unless the stream holds it (jobs stored by older versions)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.job(job_id), "created_at")
        pipe.xrange(self.keys.events(job_id))
        created, entries = pipe.execute()
        events = [
            Event(
                at=float(f["at"]),
                state=f["state"],
                attempt=int(f["attempt"]),
                reason=f["reason"],
                node=f.get("node") or None,
            )
            for _, f in entries
        ]
        first = events[0] if events else None
        stored = first is not None and (first.state, first.attempt, first.reason) == (
            JobState.QUEUED,
            0,
            "submitted",
        )
        if created is not None and not stored:
            events.insert(0, Event(at=float(created), state=JobState.QUEUED, attempt=0, reason="submitted"))
        return events

    @translated
    def last_event(self, job_id: str) -> str:
        """The id of the newest entry of the job's history (``"0"``: none yet)."""
        newest = self.redis.xrevrange(self.keys.events(job_id), count=1)
        return str(newest[0][0]) if newest else "0"

    @translated
    def wait_event(self, job_id: str, after: str, block_ms: int) -> str:
        """Block until the job's history grows past ``after``; return the newest entry id."""
        got = self.redis.xread({self.keys.events(job_id): after}, block=block_ms)
        if not got:
            return after
        return str(got[0][1][-1][0])

    @translated
    def count_queued(self) -> int:
        return int(self.redis.zcard(self.keys.queued))

    @translated
    def changed_since(self, version: int) -> tuple[list[str], int, bool]:
        """Jobs a user changed in the queue after ``version`` (``lib/changed.lua``), the version now,
        and whether some changes since ``version`` are no longer listed (trimmed, or the counter went
        back: a Redis restored or flushed): then the caller reads its whole queue again."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(k.changed_version)
        pipe.get(k.changed_trimmed)
        pipe.zrangebyscore(k.changed, f"({version}", "+inf")
        now, trimmed, ids = pipe.execute()
        now = int(now or 0)
        return ids, now, now < version or int(trimmed or 0) > version

    @translated
    def queued_ids(self) -> list[str]:
        return list(self.redis.zrange(self.keys.queued, 0, -1))

    @translated
    def quarantined(self) -> dict[str, str]:
        """Job id -> why its record cannot be read, for every job set aside."""
        return dict(self.redis.hgetall(self.keys.quarantined_jobs))

    # -- metrics ----------------------------------------------------------------------

    @translated
    def count_by_state(self) -> dict[JobState, int]:
        pipe = self.redis.pipeline(transaction=False)
        for state in JobState:
            pipe.scard(self.keys.jobs_in(state))
        return dict(zip(JobState, map(int, pipe.execute()), strict=True))

    @translated
    def requeue_counts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.redis.hgetall(self.keys.requeues).items()}
