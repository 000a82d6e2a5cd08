"""Changes of a job's state in Redis: placements, transitions, the end of an attempt, cancels,
quarantine. A controller's writes carry its ``leader`` value, refused with :class:`NotLeader` unless
it still holds the lease (the fencing token)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.errors import NotFound, NotLeader
from fleet.keys import Keys
from fleet.models import ON_NODE_STATES, Decision, Exit, ExitKind, Job, JobState, MemberPhase
from fleet.models.arrays import ARRAY_BATCH
from fleet.state.connection import translated
from fleet.state.replication import replicated

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


class JobTransitions:
    """The changes of :class:`fleet.state.jobs.JobStore` (which it is a part of)."""

    redis: Any
    keys: Keys
    _scripts: dict[str, Any]

    def replicated(self, what: str) -> None:
        """Return once the writes answered so far are on the replicas acknowledged writes wait for;
        :class:`~fleet.state.replication.NotReplicated` naming ``what`` otherwise."""
        replicated(self.redis, self.keys, what)

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
        self.replicated(f"a placement batch of {len(placements)} job(s)")  # before any agent is told
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
            self._scripts["set_reasons"](
                keys=[self.keys.leader], args=[leader, self.keys.prefix, now, batch], client=pipe
            )
        if any(code == -2 for code in pipe.execute()):
            raise NotLeader("waiting reasons refused: another controller holds the leader lease")

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
            job_id,
            to=to,
            allowed=allowed,
            reason=reason,
            now=now,
            attempt=attempt,
            fields=fields,
            incr=incr,
            release=release,
            record=record,
            leader=leader,
        )
        if code == -1:
            raise NotFound(f"no job {job_id!r}")
        if code == -2:
            raise NotLeader(f"change of {job_id} refused: another controller holds the leader lease")
        return bool(code == 1)

    def _transition_call(
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
        client: Any = None,
    ) -> Any:
        """Run (or, with a pipeline as ``client``, queue) the transition script."""
        k = self.keys
        args = [
            job_id,
            "" if attempt is None else str(attempt),
            ",".join(s.value for s in allowed),
            "" if to is None else to.value,
            reason,
            now,
            json.dumps({f: "" if v is None else str(v) for f, v in (fields or {}).items()}),
            json.dumps(incr or {}),
            k.prefix,
            "1" if release else "0",
            "1" if record else "0",
            leader,
        ]
        keys = [k.job(job_id), k.events(job_id), k.claims, k.queued, k.leader, k.ended]
        return self._scripts["transition"](keys=keys, args=args, client=client)

    def record_exit(self, job: Job, exit: Exit, now: float) -> bool:
        """Keep how ``job``'s current attempt ended before its container is removed, so a Redis
        error between the removal and :meth:`end_attempt` cannot turn a finished attempt into a
        lost one (and a SUCCEEDED job into one that runs again)."""
        saved = json.dumps({"attempt": job.attempt, **exit.model_dump()})
        kept = self.transition(
            job.id,
            attempt=job.attempt,
            to=None,
            allowed=ON_NODE_STATES,
            now=now,
            record=False,
            reason=f"attempt {job.attempt} ended: {exit.reason}",
            fields={"exit": saved},
        )
        # replicated before the attempt is removed: a promoted replica must not find it lost
        self.replicated(f"the exit of job {job.id} attempt {job.attempt}")
        return kept

    def end_attempt(
        self,
        job: Job,
        exit: Exit,
        decision: Decision,
        now: float,
        fields: dict[str, Any] | None = None,
        leader: str = "",
        allowed: Iterable[JobState] = ON_NODE_STATES,
    ) -> bool:
        """End ``job``'s current attempt as ``decision`` says (the caller's, from
        ``fleet.lifecycle.decide``: the store applies policy, it does not make it): transition,
        release its GPUs, count a requeue. The one place an attempt ends, for the agent and the
        controller (which passes its ``leader`` value, so a deposed one changes nothing) alike;
        False if stale."""
        changes = {
            "exit_code": exit.code,
            "not_before": now + decision.delay,
            "preempt": "",
            "preempted_for": "",
            "finished_at": now if decision.state.final else None,
            "resize_gpus": None,
            "resize_batch": 0,
            **(fields or {}),
        }
        if exit.kind == ExitKind.RESIZE and decision.state == JobState.QUEUED and job.resize_gpus is not None:
            changes.update(num_gpus=job.resize_gpus, batch_size=job.resize_batch, sized_at=now)
        applied = self.transition(
            job.id,
            attempt=job.attempt,
            allowed=allowed,
            to=decision.state,
            reason=decision.reason,
            now=now,
            fields=changes,
            incr=decision.incr,
            release=True,
            leader=leader,
        )
        if applied and decision.state == JobState.QUEUED:
            self.count_requeue(exit.requeue_kind)
        self.replicated(f"the end of job {job.id} attempt {job.attempt}")
        return applied

    def resize(
        self, job: Job, gpus: int, batch: int, reason: str, grace_s: float, now: float, leader: str = ""
    ) -> bool:
        """Give elastic ``job`` a new size. Queued: it is placed at that size. On a node: its attempt is
        to leave (the caller sends the SIGTERM, ``grace_s`` to checkpoint), and its end requeues it at
        that size without spending a retry (see ``end_attempt``). False when it moved on meanwhile."""
        if job.state == JobState.QUEUED:
            fields: dict[str, Any] = {"num_gpus": gpus, "batch_size": batch, "sized_at": now}
            return self.transition(
                job.id,
                attempt=job.attempt,
                to=None,
                allowed=[JobState.QUEUED],
                now=now,
                reason=reason,
                fields=fields,
                leader=leader,
            )
        return self.ask_to_leave(job, reason, grace_s, now, leader, resize_to=(gpus, batch))

    def rebatch(self, job: Job, batch: int, reason: str, now: float, leader: str = "") -> bool:
        """Give running elastic ``job`` a new global batch where it runs (it follows such a change in
        place: the caller tells its agents, which tell the attempt). False when it moved on."""
        return self.transition(
            job.id,
            attempt=job.attempt,
            to=None,
            allowed=[JobState.RUNNING],
            now=now,
            reason=reason,
            fields={"batch_size": batch},
            leader=leader,
        )

    def ask_to_leave(
        self,
        job: Job,
        reason: str,
        grace_s: float,
        now: float,
        leader: str = "",
        *,
        allowed: Iterable[JobState] = ON_NODE_STATES,
        preempted_for: str = "",
        resize_to: tuple[int, int] | None = None,
    ) -> bool:
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
            job.id,
            attempt=job.attempt,
            to=None,
            allowed=allowed,
            now=now,
            fields=fields,
            reason=f"{reason}: stopping with {grace_s:g}s to checkpoint",
            leader=leader,
        )

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
        self.replicated(f"the cancel of {len(job_ids)} job(s)")
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
    def quarantine(self, job_id: str, reason: str, now: float, leader: str) -> bool:
        """Set aside a record that cannot be read (leader only); True the first time, False after."""
        k = self.keys
        keys = [k.job(job_id), k.events(job_id), k.quarantined_jobs, k.queued, k.claims, k.leader, k.ended]
        args = [job_id, reason, now, k.prefix, leader, ",".join(s.value for s in JobState)]
        code = self._scripts["quarantine_job"](keys=keys, args=args)
        if code == -2:
            raise NotLeader(f"quarantine of {job_id} refused: another controller holds the leader lease")
        return bool(code == 1)

    @translated
    def count_requeue(self, kind: str) -> None:
        self.redis.hincrby(self.keys.requeues, kind, 1)
