"""Jobs in Redis: create, read, place, transition, history and logs."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from fleet.errors import CorruptRecord, IdInUse, NotFound, NotLeader
from fleet.keys import Keys
from fleet.models import (
    ON_NODE_STATES,
    Decision,
    Event,
    Exit,
    ExitKind,
    Job,
    JobArray,
    JobSpec,
    JobState,
    LogLine,
    MemberPhase,
    Progress,
    check_job_id,
)
from fleet.models.arrays import ARRAY_BATCH
from fleet.state.connection import load_scripts, translated
from fleet.state.records import JobBatch, parse_array, parse_job, parse_tombstone

#: waiting reasons per set_reasons.lua call (one call holds Redis for about a millisecond)
REASONS_BATCH = 1000


@dataclass(frozen=True)
class CancelOutcome:
    """What cancel.lua did to one job. ``code``: 1 cancelled at once (it was queued), 2 flagged on
    ``node`` for its agent to stop ``attempt``, 0 already final (``state``), -1 no such job."""

    job_id: str
    code: int
    state: str
    node: str | None
    attempt: int


class JobStore:
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
            raise IdInUse(f"{self._missing(job_id)}; its id is free again once that is forgotten "
                          "(tombstone_retention_s): choose another id")  # fmt: skip
        if created == -2:
            raise IdInUse(f"job id {job_id!r} is the id of a job array; choose another id")
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
        return [int(code) for code in pipe.execute()]

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
        keys = [k.job(job_id), k.seq, k.jobs, k.queued, k.jobs_in(JobState.QUEUED), k.tombstone(job_id),
                k.array(job_id)]  # fmt: skip
        rank = f"{spec.priority} {spec.tenant}"
        args = [job_id, spec.model_dump_json(), now, "submitted", owner, rank, k.prefix, spec.tenant]
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
                at=float(f["at"]), state=f["state"], attempt=int(f["attempt"]), reason=f["reason"],
                node=f.get("node") or None,
            )
            for _, f in entries
        ]  # fmt: skip
        stored = events[:1] and events[0].state == JobState.QUEUED and events[0].attempt == 0
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

    # -- change ----------------------------------------------------------------------

    def place(self, job_id: str, node: str, gpus: list[str], leader: str, now: float, reason: str) -> int:
        """Bind one QUEUED job to ``node``/``gpus``; the new attempt, or 0 when refused."""
        batch = [{"job": job_id, "node": node, "gpus": gpus, "cpus": 0, "memory": 0, "reason": reason}]
        return self.place_many(batch, leader, now)[0]

    @translated
    def place_many(
        self, placements: list[dict[str, Any]], leader: str, now: float, ports: tuple[int, int] = (29400, 500)
    ) -> list[int]:
        """Bind many QUEUED jobs at once (``{job, node, gpus, cpus, memory, reason}`` each, and for a
        multi-node job ``members`` and ``master_addr``: see place_many.lua) in one atomic script; the
        new attempt per placement, 0 where refused. ``ports``: (first, how many) rendezvous ports."""
        if not placements:
            return []
        result = self._scripts["place_many"](
            keys=[self.keys.leader, self.keys.claims],
            args=[self.keys.prefix, leader, now, json.dumps(placements), *ports],
        )
        if result == [-2]:
            raise NotLeader("placements refused: another controller holds the leader lease")
        return [int(a) for a in result]

    @translated
    def member(self, job: Job, rank: int, phase: MemberPhase) -> int:
        """Move the member on ``rank`` of multi-node ``job`` to ``phase`` (starting, running, done, failed);
        how many members reached it, or -1 when stale (see member.lua)."""
        return int(self._scripts["member"](keys=[self.keys.job(job.id)], args=[job.attempt, rank, phase]))

    @translated
    def set_reasons(self, reasons: dict[str, str], leader: str, now: float) -> None:
        """Write the waiting reasons of QUEUED jobs, ``REASONS_BATCH`` per script call, in one
        pipeline (no history entry): a shape of 10,000 jobs whose reason changed costs milliseconds."""
        pipe, items = self.redis.pipeline(transaction=False), list(reasons.items())
        for start in range(0, len(items), REASONS_BATCH):
            batch = json.dumps(dict(items[start : start + REASONS_BATCH]))
            self._scripts["set_reasons"](keys=[self.keys.leader], args=[leader, self.keys.prefix, now, batch],
                                         client=pipe)  # fmt: skip
        if any(code == -2 for code in pipe.execute()):
            raise NotLeader("waiting reasons refused: another controller holds the leader lease")

    @translated
    def count_queued(self) -> int:
        return int(self.redis.zcard(self.keys.queued))

    @translated
    def queued_ids(self) -> list[str]:
        return list(self.redis.zrange(self.keys.queued, 0, -1))

    @translated
    def transition(
        self,
        job_id: str,
        *,
        to: JobState | None,
        allowed: Iterable[JobState],
        reason: str,
        now: float,
        attempt: int | None = None,
        fields: dict[str, Any] | None = None,
        incr: dict[str, int] | None = None,
        release: bool = False,
        record: bool = True,
        leader: str = "",
    ) -> bool:
        """Atomically move a job from one of ``allowed`` to ``to``; False when refused (stale).

        A controller passes its ``leader`` value: the write is refused with :class:`NotLeader`
        unless it still holds the lease.
        """
        code, _state = self._transition_call(
            job_id, to=to, allowed=allowed, reason=reason, now=now, attempt=attempt, fields=fields,
            incr=incr, release=release, record=record, leader=leader,
        )  # fmt: skip
        if code == -1:
            raise NotFound(f"no job {job_id!r}")
        if code == -2:
            raise NotLeader(f"change of {job_id} refused: another controller holds the leader lease")
        return bool(code == 1)

    def _transition_call(
        self, job_id: str, *, to: JobState | None, allowed: Iterable[JobState], reason: str, now: float,
        attempt: int | None = None, fields: dict[str, Any] | None = None, incr: dict[str, int] | None = None,
        release: bool = False, record: bool = True, leader: str = "", client: Any = None,
    ) -> Any:  # fmt: skip
        """Run (or, with a pipeline as ``client``, queue) the transition script."""
        k = self.keys
        args = [
            job_id, "" if attempt is None else str(attempt), ",".join(s.value for s in allowed),
            "" if to is None else to.value, reason, now,
            json.dumps({f: "" if v is None else str(v) for f, v in (fields or {}).items()}),
            json.dumps(incr or {}), k.prefix, "1" if release else "0", "1" if record else "0", leader,
        ]  # fmt: skip
        keys = [k.job(job_id), k.events(job_id), k.claims, k.queued, k.leader, k.ended]
        return self._scripts["transition"](keys=keys, args=args, client=client)

    def record_exit(self, job: Job, exit: Exit, now: float) -> bool:
        """Keep how ``job``'s current attempt ended before its container is removed, so a Redis
        error between the removal and :meth:`end_attempt` cannot turn a finished attempt into a
        lost one (and a SUCCEEDED job into one that runs again)."""
        saved = json.dumps({"attempt": job.attempt, **exit.model_dump()})
        return self.transition(
            job.id, attempt=job.attempt, to=None, allowed=ON_NODE_STATES, now=now, record=False,
            reason=f"attempt {job.attempt} ended: {exit.reason}", fields={"exit": saved},
        )  # fmt: skip

    def end_attempt(
        self, job: Job, exit: Exit, decision: Decision, now: float, fields: dict[str, Any] | None = None,
        leader: str = "", allowed: Iterable[JobState] = ON_NODE_STATES,
    ) -> bool:  # fmt: skip
        """End ``job``'s current attempt as ``decision`` says (the caller's, from
        ``fleet.lifecycle.decide``: the store applies policy, it does not make it): transition,
        release its GPUs, count a requeue. The one place an attempt ends, for the agent and the
        controller (which passes its ``leader`` value, so a deposed one changes nothing) alike;
        False if stale."""
        changes = {
            "exit_code": exit.code, "not_before": now + decision.delay, "preempt": "", "preempted_for": "",
            "finished_at": now if decision.state.final else None, "resize_gpus": None, "resize_batch": 0,
            **(fields or {}),
        }  # fmt: skip
        if exit.kind == ExitKind.RESIZE and decision.state == JobState.QUEUED and job.resize_gpus is not None:
            changes.update(num_gpus=job.resize_gpus, batch_size=job.resize_batch, sized_at=now)
        applied = self.transition(
            job.id, attempt=job.attempt, allowed=allowed, to=decision.state, reason=decision.reason,
            now=now, fields=changes, incr=decision.incr, release=True, leader=leader,
        )  # fmt: skip
        if applied and decision.state == JobState.QUEUED:
            self.count_requeue(exit.requeue_kind)
        return applied

    def resize(
        self, job: Job, gpus: int, batch: int, reason: str, grace_s: float, now: float, leader: str = ""
    ) -> bool:
        """Give elastic ``job`` a new size. Queued: it is placed at that size. On a node: its attempt is
        to leave (the caller sends the SIGTERM, ``grace_s`` to checkpoint), and its end requeues it at
        that size without spending a retry (see ``end_attempt``). False when it moved on meanwhile."""
        if job.state == JobState.QUEUED:
            fields: dict[str, Any] = {"num_gpus": gpus, "batch_size": batch, "sized_at": now}
            return self.transition(job.id, attempt=job.attempt, to=None, allowed=[JobState.QUEUED], now=now,
                                   reason=reason, fields=fields, leader=leader)  # fmt: skip
        return self.ask_to_leave(job, reason, grace_s, now, leader, resize_to=(gpus, batch))

    def ask_to_leave(
        self, job: Job, reason: str, grace_s: float, now: float, leader: str = "", *,
        allowed: Iterable[JobState] = ON_NODE_STATES, preempted_for: str = "",
        resize_to: tuple[int, int] | None = None,
    ) -> bool:  # fmt: skip
        """Mark ``job``'s attempt to leave its nodes (a drain, a preemption for ``preempted_for``, a
        resize to ``resize_to`` = (GPUs, batch)): its end then requeues it without spending a retry
        (see ``end_attempt``). The caller sends the Stop (``fleet.bus.stop_attempt``) with ``grace_s``
        to checkpoint. False when the attempt moved on meanwhile (or is not in ``allowed``)."""
        fields: dict[str, Any] = {"preempt": reason}
        if preempted_for:
            fields["preempted_for"] = preempted_for
        if resize_to is not None:
            fields["resize_gpus"], fields["resize_batch"] = resize_to
        return self.transition(
            job.id, attempt=job.attempt, to=None, allowed=allowed, now=now, fields=fields,
            reason=f"{reason}: stopping with {grace_s:g}s to checkpoint", leader=leader,
        )  # fmt: skip

    def request_cancel(self, job_id: str, now: float) -> bool:
        """Cancel a queued job at once, or flag one on a node for its agent; False if already final.

        One script (cancel.lua): a placement or requeue can land before or after it, never between.
        """
        (outcome,) = self.cancel_many([job_id], now)
        if outcome.code == -1:
            raise NotFound(f"no job {job_id!r}")
        return outcome.code > 0

    @translated
    def cancel_many(self, job_ids: Sequence[str], now: float) -> list[CancelOutcome]:
        """:meth:`request_cancel` for each of ``job_ids``, in one script (one atomic step) per
        ``ARRAY_BATCH`` ids; for each id in order, what happened (see :class:`CancelOutcome`)."""
        k = self.keys
        keys = [k.queued, k.jobs_in(JobState.QUEUED), k.jobs_in(JobState.CANCELLED), k.ended]
        head = [k.prefix, now, ",".join(s.value for s in ON_NODE_STATES)]
        out: list[CancelOutcome] = []
        for start in range(0, len(job_ids), ARRAY_BATCH):
            flat = self._scripts["cancel"](keys=keys, args=[*head, *job_ids[start : start + ARRAY_BATCH]])
            for i in range(0, len(flat), 4):
                code, state, node, attempt = flat[i : i + 4]
                job_id = job_ids[start + i // 4]
                out.append(CancelOutcome(job_id, int(code), state, node or None, int(attempt)))
        return out

    @translated
    def release_orphan_claims(self, claims: Iterable[tuple[str, str]], leader: str) -> int:
        """Delete each ``(uuid, holder)`` claim still held so while ``holder`` is not the current
        attempt of a job on a node (checked in the script); the number deleted (leader only)."""
        k = self.keys
        args = [leader, k.prefix, ",".join(s.value for s in ON_NODE_STATES)]
        args += [part for claim in claims for part in claim]
        deleted = int(self._scripts["release_orphans"](keys=[k.claims, k.leader], args=args))
        if deleted == -2:
            raise NotLeader("release of orphan claims refused: another controller holds the leader lease")
        return deleted

    @translated
    def quarantined(self) -> dict[str, str]:
        """Job id -> why its record cannot be read, for every job set aside."""
        return dict(self.redis.hgetall(self.keys.quarantined_jobs))

    @translated
    def quarantine(self, job_id: str, reason: str, now: float, leader: str) -> bool:
        """Set aside a record that cannot be read (leader only); True the first time, False after."""
        k = self.keys
        keys = [k.job(job_id), k.events(job_id), k.quarantined_jobs, k.queued, k.claims, k.leader, k.ended]
        args = [job_id, reason, now, k.prefix, leader, ",".join(s.value for s in JobState)]
        code = self._scripts["quarantine_job"](keys=keys, args=args)
        if code == -2:
            raise NotLeader(f"quarantine of {job_id} refused: another controller holds the leader lease")
        return bool(code == 1)

    # -- metrics ----------------------------------------------------------------------

    @translated
    def count_requeue(self, kind: str) -> None:
        self.redis.hincrby(self.keys.requeues, kind, 1)

    @translated
    def count_by_state(self) -> dict[JobState, int]:
        pipe = self.redis.pipeline(transaction=False)
        for state in JobState:
            pipe.scard(self.keys.jobs_in(state))
        return dict(zip(JobState, map(int, pipe.execute()), strict=True))

    @translated
    def requeue_counts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.redis.hgetall(self.keys.requeues).items()}

    # -- logs -------------------------------------------------------------------------

    @translated
    def append_logs(self, job_id: str, attempt: int, lines: list[tuple[str, str]], max_lines: int) -> None:
        """Append ``(cursor, line)`` pairs; the runtime's cursor lets a restarted agent resume shipping."""
        self.append_logs_many({(job_id, attempt, 0): lines}, max_lines)

    @translated
    def append_logs_many(
        self, batches: Mapping[tuple[str, int, int], Sequence[tuple[str, str]]], max_lines: int,
        progress: Mapping[tuple[str, int], Progress] | None = None,
        caps: Mapping[tuple[str, int, int], int] | None = None,
    ) -> None:  # fmt: skip
        """Append every stream's ``(cursor, line)`` pairs (a stream: job, attempt, member rank), in
        order, each stream kept to its last ``caps[stream]`` lines (``max_lines`` by default), and
        keep each attempt's last ``progress`` report (progress.lua: only the job's latest
        attempt's), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for stream, lines in batches.items():
            key = self.keys.logs(*stream)
            cap = (caps or {}).get(stream, max_lines)
            for cursor, line in lines:
                pipe.xadd(key, {"l": line, "c": cursor}, maxlen=cap, approximate=True)
        for (job_id, attempt), report in (progress or {}).items():
            stored = json.dumps({"attempt": attempt, **report.model_dump(mode="json")})
            rate = report.metrics.get("samples_per_s", "")
            self._scripts["progress"](keys=[self.keys.job(job_id)], args=[attempt, stored, rate], client=pipe)
        pipe.execute()

    @translated
    def last_log_cursors(self, streams: Sequence[tuple[str, int, int]]) -> list[str | None]:
        """The cursor of the last line stored in each stream (job, attempt, member rank; None: none
        yet), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id, attempt, rank in streams:
            pipe.xrevrange(self.keys.logs(job_id, attempt, rank), count=1)
        return [str(last[0][1]["c"]) if last else None for last in pipe.execute()]

    @translated
    def log_tail(self, job_id: str, attempt: int, count: int, rank: int = 0) -> list[str]:
        """The attempt's last ``count`` lines, oldest first."""
        entries = self.redis.xrevrange(self.keys.logs(job_id, attempt, rank), count=count)
        return [f["l"] for _, f in reversed(entries)]

    @translated
    def read_logs(
        self, job_id: str, attempt: int, after: str = "0", block_ms: int | None = None, rank: int = 0
    ) -> list[LogLine]:
        key = self.keys.logs(job_id, attempt, rank)
        if block_ms is None:
            entries = self.redis.xrange(key, min=f"({after}" if after != "0" else "-")
        else:
            got = self.redis.xread({key: after}, block=block_ms)
            entries = got[0][1] if got else []
        return [LogLine(id=eid, attempt=attempt, line=f["l"]) for eid, f in entries]
