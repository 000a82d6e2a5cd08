"""Job arrays in Redis: create one in a script, count its tasks, list jobs with arrays grouped.

An array's tasks are ordinary jobs (``JobStore`` reads, places, transitions and cancels them);
this module keeps what is the array's own: its record (the spec, stored once), creation in
``ARRAY_BATCH``-task atomic steps, and views over all its tasks at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from fleet.errors import CorruptRecord, NotFound, SpecError
from fleet.models import ON_NODE_STATES, Job, JobArray, JobSpec, JobState, check_job_id
from fleet.models.arrays import ARRAY_BATCH, normal_form, task_ids
from fleet.state.connection import load_scripts, translated
from fleet.state.jobs import JobStore

#: FAILED task ids an array summary names
FAILED_SHOWN = 20
#: ids read per round trip while walking the job list newest first
_CHUNK = 500


class ArrayStore:
    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self.redis: Any = jobs.redis
        self.keys = jobs.keys
        self._scripts = load_scripts(jobs.redis)

    # -- create ------------------------------------------------------------------------

    @translated
    def create(
        self,
        array_id: str,
        spec: JobSpec,
        indices: tuple[int, ...],
        max_running: int | None,
        now: float,
        generated: bool = False,
        owner: str = "",
    ) -> bool:
        """Store the array and its QUEUED tasks (idempotent); False when the ``generated`` id turns
        out to be another array's (the caller picks another).

        One script per ``ARRAY_BATCH`` tasks, all sent in one round trip: an array of up to
        ``ARRAY_BATCH`` tasks appears at once or not at all; a larger one batch by batch, and a
        retried submit (same ``now``) creates only the tasks still missing.
        """
        check_job_id(array_id)
        check_job_id(f"{array_id}-{indices[-1]}")
        k = self.keys
        keys = [
            k.array(array_id),
            k.seq,
            k.jobs,
            k.queued,
            k.jobs_in(JobState.QUEUED),
            k.arrays,
            k.job(array_id),
        ]
        head = [
            array_id,
            spec.model_dump_json(),
            normal_form(indices),
            len(indices),
            "" if max_running is None else max_running,
            now,
            k.prefix,
            "submitted",
            "1" if generated else "0",
            owner,
            spec.priority,
            spec.tenant,
            "" if spec.call is None else spec.call.blob.removeprefix("sha256:"),
        ]
        pipe = self.redis.pipeline(transaction=False)
        for start in range(0, len(indices), ARRAY_BATCH):
            self._scripts["submit_array"](
                keys=keys, args=[*head, *indices[start : start + ARRAY_BATCH]], client=pipe
            )
        for code, detail in pipe.execute():
            if int(code) < 0 and generated:
                return False  # a generated id someone else's job, array or tombstone holds
            _refused(array_id, int(code), detail)
        self.jobs.replicated(f"the submit of job array {array_id}")
        return True

    # -- read --------------------------------------------------------------------------

    @translated
    def get(self, array_id: str) -> JobArray:
        """The array with how its tasks stand; :class:`NotFound` if there is none."""
        found = self.summaries([array_id])
        if not found:
            if self.redis.exists(self.keys.array(array_id)):
                raise CorruptRecord(f"the record of job array {array_id} cannot be read")
            raise NotFound(f"no job or job array {array_id!r} (list them with `fleet jobs`)")
        return found[0]

    @translated
    def summaries(self, array_ids: Sequence[str]) -> list[JobArray]:
        """The arrays that exist, in the order asked, each with its tasks counted by state."""
        records = self.jobs.arrays(array_ids)
        arrays = [records[a] for a in dict.fromkeys(array_ids) if a in records]
        pipe = self.redis.pipeline(transaction=False)
        for array in arrays:
            args = [self.keys.prefix, array.id, array.indices, FAILED_SHOWN]
            self._scripts["array_tasks"](keys=[], args=args, client=pipe)
        out = []
        for array, text in zip(arrays, pipe.execute(), strict=True):
            seen = json.loads(text)
            tasks = {s: int(seen["counts"].get(s.value, 0)) for s in JobState}
            out.append(array.model_copy(update={"tasks": tasks, "failed": list(seen["failed"] or [])}))
        return out

    def task_ids(self, array_id: str) -> list[str]:
        """Every task id of the array (without counting where its tasks stand)."""
        # get() (which also counts the tasks) only to say why there is no readable record
        record = self.jobs.arrays([array_id]).get(array_id) or self.get(array_id)
        return task_ids(array_id, record.indices)

    @translated
    def matching(self, labels: dict[str, str], tenant: str | None = None) -> list[str]:
        """Ids of the jobs not yet final (queued or on nodes) that carry every one of ``labels``
        (and belong to ``tenant``, when given)."""
        k = self.keys
        ids = self.redis.sunion([k.jobs_in(s) for s in (JobState.QUEUED, *ON_NODE_STATES)])
        jobs = sorted(self.jobs.get_many(ids), key=lambda j: j.seq)
        mine = [j for j in jobs if tenant in (None, j.spec.tenant)]
        return [j.id for j in mine if all(j.spec.labels.get(key) == v for key, v in labels.items())]

    # -- list --------------------------------------------------------------------------

    @translated
    def listing(
        self, state: JobState | None = None, limit: int = 100, tenant: str | None = None
    ) -> list[Job | JobArray]:
        """Jobs newest first with each array as one entry (in ``state``: the jobs in it, and the
        arrays with a task in it), at most ``limit`` entries; only ``tenant``'s, when given."""
        entries = self._newest(limit, tenant) if state is None else self._newest_in(state, limit, tenant)
        found: dict[tuple[str, bool], Job | JobArray] = {}
        for job in self.jobs.get_many(i for i, is_array in entries if not is_array):
            found[job.id, False] = job
        for array in self.summaries([i for i, is_array in entries if is_array]):
            found[array.id, True] = array
        return [found[e] for e in entries if e in found]

    def _newest(self, limit: int, tenant: str | None) -> list[tuple[str, bool]]:
        """(id, is an array) newest first: walks the all-jobs zset (or the tenant's), skipping the
        seq range of an array created in one step at once, so a 50,000-task array costs one read,
        not 50,000."""
        listing = self.keys.jobs_of(tenant)
        out: dict[str, bool] = {}
        top = "+inf"
        while len(out) < limit:
            want = min(_CHUNK, limit - len(out) + 1)  # each id costs a read: no more than may be shown
            chunk = self.redis.zrevrangebyscore(listing, top, "-inf", 0, want, withscores=True)
            if not chunk:
                break
            owners = self._owners(job_id for job_id, _ in chunk)
            top = f"({int(chunk[-1][1])}"
            for (job_id, _), array_id in zip(chunk, owners, strict=True):
                if array_id is None or array_id in out:
                    out.setdefault(job_id if array_id is None else array_id, False)
                    continue
                out[array_id] = True
                start = self._range_start(array_id)
                if start is not None or len(out) >= limit:
                    top = f"({start}" if start is not None else top
                    break
        return list(out.items())[:limit]

    def _newest_in(self, state: JobState, limit: int, tenant: str | None) -> list[tuple[str, bool]]:
        """(id, is an array) of the newest entries with a job in ``state``: the newest jobs in it,
        read four times as many at a time until ``limit`` entries (an array's tasks make one)."""
        want = limit
        while True:
            found = self.jobs.newest_in(state, want, tenant)
            entries: dict[tuple[str, bool], None] = {}
            for (job_id, _), array_id in zip(found, self._owners(i for i, _ in found), strict=True):
                entries.setdefault((array_id or job_id, bool(array_id)), None)
            if len(entries) >= limit or len(found) < want:
                return list(entries)[:limit]
            want *= 4

    def _owners(self, job_ids: Iterable[str]) -> list[str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job(job_id), "array")
        return list(pipe.execute())

    def _range_start(self, array_id: str) -> int | None:
        """The first seq of the array's tasks when every seq from it to its last is the array's."""
        seq, gaps = self.redis.hmget(self.keys.array(array_id), "seq", "gaps")
        return int(seq) if seq and not gaps else None


def _refused(array_id: str, code: int, detail: str) -> None:
    """Raise what the submit_array script's refusal ``code`` means (nothing for a success)."""
    if code == -1:
        raise SpecError(f"job array {array_id!r} already exists with a different {detail}; choose another id")
    if code == -2:
        raise SpecError(
            f"task id {detail!r} of job array {array_id!r} is taken by another job; choose another id"
        )
    if code == -3:
        raise SpecError(f"job array id {array_id!r} is the id of a job; choose another id")
    if code == -4:
        raise SpecError(
            f"task id {detail!r} of job array {array_id!r} was the id of a job that ended and was deleted; "
            "its id is free again once that is forgotten (tombstone_retention_s): choose another array id"
        )
