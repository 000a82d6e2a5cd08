"""A user's control of jobs already submitted, in Redis: hold, release and update a queued job
(``change_queued.lua``), change the time limit of one on its nodes (``set_time_limit.lua``), queue
final ones again (``requeue_final.lua``). Each is one atomic script, so a placement lands wholly
before or after it; each change bumps the job's revision, and a placement the leader decided from
an older one is refused (``place_many.lua``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleet.errors import NotFound
from fleet.models import JobState, check_job_id
from fleet.models.arrays import ARRAY_BATCH
from fleet.state.connection import load_scripts, translated
from fleet.state.jobs import JobStore


class Need(StrEnum):
    """What a change needs of the job's hold (``change_queued.lua``'s ARGV[6])."""

    FREE = "free"
    HELD = "held"
    ANY = ""


@dataclass(frozen=True)
class Changed:
    """What ``change_queued.lua`` did: ``applied``, else why not: the job's ``state`` (not QUEUED),
    or who holds it (``held_by``; '' when it needed a hold and had none)."""

    applied: bool
    state: str
    held_by: str = ""
    unmet: bool = False


class JobControl:
    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self.keys = jobs.keys
        self._scripts = load_scripts(jobs.redis)

    @translated
    def change_queued(
        self,
        job_id: str,
        now: float,
        reason: str,
        fields: dict[str, Any],
        need: Need = Need.ANY,
        queue: str = "",
    ) -> Changed:
        """Set ``fields`` of QUEUED ``job_id`` (and with ``queue``, "<priority> <tenant>", its place in
        the queue), with ``reason`` in its history; :class:`NotFound` for no such job."""
        k = self.keys
        args = [check_job_id(job_id), now, reason, json.dumps(fields), k.prefix, need.value, queue]
        code, detail = self._scripts["change_queued"](keys=[k.job(job_id), k.events(job_id)], args=args)
        if int(code) == -1:
            raise NotFound(f"no job {job_id!r} (list jobs with `fleet jobs`)")
        self.jobs.replicated(f"the change of job {job_id}")
        return _changed(int(code), detail)

    @translated
    def set_time_limit(self, job_id: str, attempt: int, spec: str, reason: str, now: float) -> Changed:
        """Replace the spec (``spec``, JSON: its time limit changed) of ``job_id`` while it is on its
        nodes in ``attempt`` (``set_time_limit.lua``); :class:`NotFound` for no such job."""
        keys = [self.keys.job(check_job_id(job_id)), self.keys.events(job_id)]
        code, state = self._scripts["set_time_limit"](keys=keys, args=[now, reason, spec, attempt])
        if int(code) == -1:
            raise NotFound(f"no job {job_id!r} (list jobs with `fleet jobs`)")
        return Changed(int(code) == 1, state)

    @translated
    def change_many(
        self, job_ids: Sequence[str], now: float, reason: str, fields: dict[str, Any], need: Need
    ) -> list[tuple[str, Changed]]:
        """:meth:`change_queued` for each of ``job_ids`` (a job array's tasks), pipelined by
        ``ARRAY_BATCH``: each an atomic step of its own; an id no job holds is left out."""
        k, script, body = self.keys, self._scripts["change_queued"], json.dumps(fields)
        out: list[tuple[str, Changed]] = []
        for start in range(0, len(job_ids), ARRAY_BATCH):
            batch = job_ids[start : start + ARRAY_BATCH]
            pipe = self.jobs.redis.pipeline(transaction=False)
            for job_id in batch:
                args = [check_job_id(job_id), now, reason, body, k.prefix, need.value, ""]
                script(keys=[k.job(job_id), k.events(job_id)], args=args, client=pipe)
            for job_id, (code, detail) in zip(batch, pipe.execute(), strict=True):
                if int(code) != -1:
                    out.append((job_id, _changed(int(code), detail)))
        self.jobs.replicated(f"the change of {len(job_ids)} job(s)")
        return out

    @translated
    def requeue(
        self, job_ids: Sequence[str], states: Sequence[JobState], reason: str, now: float
    ) -> list[tuple[str, int, str]]:
        """Queue again each of ``job_ids`` that is in one of ``states`` (final ones); per id, in order:
        (id, 1 requeued / 0 in another state / -1 no such job, the state it was in). One atomic step
        per ``ARRAY_BATCH`` ids."""
        k = self.keys
        keys = [k.ended, k.jobs_in(JobState.QUEUED)]
        head = [k.prefix, now, reason, ",".join(s.value for s in states)]
        out: list[tuple[str, int, str]] = []
        for start in range(0, len(job_ids), ARRAY_BATCH):
            batch = job_ids[start : start + ARRAY_BATCH]
            flat = self._scripts["requeue_final"](keys=keys, args=[*head, *batch])
            out.extend((job_id, int(flat[2 * i]), flat[2 * i + 1]) for i, job_id in enumerate(batch))
        self.jobs.replicated(f"the requeue of {len(job_ids)} job(s)")
        return out


def _changed(code: int, detail: str) -> Changed:
    """What ``change_queued.lua`` answered (a job it found)."""
    if code == 2:
        return Changed(False, JobState.QUEUED.value, detail, unmet=True)
    return Changed(code == 1, detail)
