"""The one way an attempt ends on a node: :meth:`ExitPath.end`.

Every end goes through it: the program exiting (0 or not), a stop or a cancel, the supervisor's
fence, a time limit, a drain, a preemption or a resize, a launch that failed or was cancelled
before it started, an attempt that vanished, and a member of a multi-node job ending (the last one
done, or one failing, ends the attempt for all). Its callers only say what they saw (the runtime's
exit, or the launch's own); :func:`settle` turns that into the attempt's end, all things known, in
one order, and ``end`` then records it, removes the attempt, ends it in the store with the retry
policy's decision and tells the controller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from fleet.agent import checkpoints
from fleet.agent import outputs as kept_outputs
from fleet.agent import reconcile as plan
from fleet.agent.gpucheck import await_released
from fleet.agent.members import member_failed
from fleet.agent.parts import Parts
from fleet.agent.runtime import AttemptStatus
from fleet.bus import Stop, node_queue
from fleet.errors import FleetError, NotFound, SpecError
from fleet.lifecycle import TAIL_LINES, decide, explain
from fleet.log import event
from fleet.models import Exit, ExitKind, Fault, Job, JobState, MemberPhase
from fleet.state import Stores

log = logging.getLogger("fleet.agent")


def time_limit(job: Job) -> float | None:
    """When the running attempt gets SIGTERM for its time limit; None without a limit."""
    if job.spec.timeout is None or job.started_at is None:
        return None
    return job.started_at + job.spec.timeout - (job.spec.signal_before or 0.0)


def settle(
    job: Job,
    exit: Exit,
    node: str,
    *,
    fenced: str | None,
    timed_out: bool,
    now: float,
    tail: Callable[[], Sequence[str]],
) -> Exit:
    """How ``job``'s current attempt on ``node`` ended, given what was seen (``exit``: the runtime's,
    or the launch's own), in this order:

    1. ``fenced`` (why the node's supervisor stopped it, or None): an infrastructure fault;
    2. a program that never ran (exit 2, "can't open file" in its last lines, read by ``tail``
       only then) fails at once (``fleet.lifecycle.explain``);
    3. stopped at its time limit (``timed_out``), or ended past it other than by succeeding (an
       agent restarted meanwhile): a timeout, FAILED or requeued as the job asked;
    4. asked to leave (a drain, a preemption, a resize): an infrastructure fault of that kind,
       unless it succeeded or was cancelled.
    """
    if fenced is not None:
        exit = Exit(
            code=exit.code,
            fault=Fault.INFRA,
            kind=ExitKind.FENCED,
            reason=f"stopped by node {node}'s supervisor: {fenced}",
        )
    if exit.code == 2 and exit.fault == Fault.JOB:  # only a candidate costs a read
        exit = explain(exit, tail())
    exit = _timed_out(job, exit, timed_out, now)
    if job.preempt and not job.cancel_requested and not exit.succeeded:
        kind = (
            ExitKind.RESIZE
            if job.resize_gpus is not None
            else ExitKind.PREEMPTED
            if job.preempted_for
            else ExitKind.DRAIN
        )
        exit = Exit(
            code=exit.code, oom=exit.oom, fault=Fault.INFRA, kind=kind, reason=f"{job.preempt}: {exit.reason}"
        )
    return exit


def _timed_out(job: Job, exit: Exit, stopped: bool, now: float) -> Exit:
    deadline = time_limit(job)
    past = deadline is not None and now >= deadline and not exit.succeeded
    if job.cancel_requested or job.preempt or not (stopped or past) or exit.fault != Fault.JOB:
        return exit
    limit = f"time limit of {job.spec.timeout:g}s reached: {exit.reason}"
    fault = Fault.INFRA if job.spec.requeue_on_timeout else Fault.FATAL
    return Exit(code=exit.code, oom=exit.oom, fault=fault, kind=ExitKind.TIMEOUT, reason=limit)


class ExitPath:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self.node = parts.node
        self.tenants = Stores.of(parts.settings, parts.jobs, parts.nodes).tenants

    # -- what was seen ---------------------------------------------------------------

    def finish(self, job_id: str, attempt: int, exit: Exit) -> bool:
        """The runtime says the attempt exited: end it if it is the job's current attempt here,
        else only remove it. False when another thread holds the attempt (its launch is not done
        yet, or the reconcile finishes it): the caller tries again."""
        with self.p.inflight.held((job_id, attempt)) as claimed:
            if not claimed:
                return False
            try:
                job = self.p.jobs.get(job_id)
            except NotFound:
                job = None
            if (
                job is not None
                and job.attempt == attempt
                and job.state in (JobState.STARTING, JobState.RUNNING)
            ):
                self.end(job, exit)
            else:
                self.remove(job_id, attempt)
        self.p.inflight.stopping.discard((job_id, attempt))  # only once recorded: an error above keeps it
        return True

    def lost(self, job: Job) -> None:
        """An attempt Redis places here that the runtime does not hold: the end recorded before its
        removal if there is one, else it vanished (not the job's fault)."""
        with self.p.inflight.held((job.id, job.attempt)) as claimed:
            if not claimed:
                return
            if any((a.job_id, a.attempt) == (job.id, job.attempt) for a in self.p.runtime.attempts()):
                return  # it started after the reconcile looked
            try:
                now = self.p.jobs.get(job.id)
            except NotFound:
                return
            if not plan.still_lost(self.node, job, now):
                return  # it ended after the reconcile looked (a member done, or its exit recorded)
            # a multi-node job keeps one recorded exit for all its members: not this member's
            single = len(now.members) <= 1
            recorded = now.last_exit if single and now.last_exit_attempt == now.attempt else None
            if recorded is not None:
                self.end(now, recorded, recorded=True)
            else:
                self.end(
                    now,
                    Exit(
                        code=None,
                        fault=Fault.INFRA,
                        kind=ExitKind.LOST,
                        reason=f"attempt vanished from node {self.node}",
                    ),
                )

    def remove(self, job_id: str, attempt: int) -> None:
        """Remove an attempt whose output is not shipped any further (stale, or its job is gone)."""
        self.p.logs.forget(job_id, attempt)
        self.p.runtime.remove(job_id, attempt)

    # -- the end ---------------------------------------------------------------------

    def end(self, job: Job, exit: Exit, *, recorded: bool = False) -> None:
        """End ``job``'s current attempt on this node, which the caller holds (``InFlight``), as
        ``exit`` says once settled (``recorded``: settled and recorded before, by an earlier end
        that a Redis error cut short).

        The last logs are shipped before the removal deletes the attempt's output. The end is
        recorded before the removal, so a Redis error in between cannot make a finished attempt look
        lost (and run a SUCCEEDED job again). The claims are released only once the attempt is gone,
        so a GPU is never handed to the next job while a process of this one may still hold it.
        """
        p, key = self.p, (job.id, job.attempt)
        rank, gang = job.rank_on(self.node) or 0, len(job.members) > 1
        if not p.logs.finish(job.id, job.attempt, timeout=10, rank=rank):
            event(log, "last_logs_not_shipped", logging.WARNING, job=job.id, attempt=job.attempt)
        if not recorded:
            exit = settle(
                job,
                exit,
                self.node,
                fenced=p.supervisor.fenced(f"{job.id}.{job.attempt}"),
                timed_out=key in p.inflight.timed_out,
                now=p.clock(),
                tail=lambda: p.jobs.log_tail(job.id, job.attempt, TAIL_LINES, rank),
            )
            p.jobs.record_exit(job, exit, p.clock())
        p.inflight.timed_out.discard(key)
        kept = self._keep_outputs(job) if rank == 0 else {}
        p.runtime.remove(job.id, job.attempt)
        self._await_gpus_released(job)
        if gang and exit.succeeded:
            done = p.jobs.member(job, rank, MemberPhase.DONE)
            if done < len(job.members):  # the others still run (or this one was counted already)
                event(log, "member_done", job=job.id, attempt=job.attempt, rank=rank, members_done=done)
                return
        elif gang:
            wait_s = p.cfg.node_lease_ttl_s + p.cfg.heartbeat_interval_s
            exit = member_failed(p.jobs, p.nodes, job, self.node, exit, wait_s, p.stop_event)
        decision = decide(job, exit, p.policy)
        if not p.jobs.end_attempt(job, exit, decision, p.clock(), {"checkpoint": self._latest(job), **kept}):
            return
        if decision.state.final:
            p.stdin.drop(job)
        if gang:  # one member's end is the attempt's: stop the others now, not at a collective's timeout
            grace = p.cfg.stop_grace_s
            stop = Stop(job_id=job.id, attempt=job.attempt, reason=decision.reason, grace_s=grace)
            for node in set(job.nodes_held) - {self.node}:
                p.bus.send(node_queue(node), stop)
        event(
            log,
            "attempt_exited",
            job=job.id,
            attempt=job.attempt,
            code=exit.code,
            state=decision.state,
            reason=decision.reason,
        )
        p.hints.name([job.id])

    def _keep_outputs(self, job: Job) -> dict[str, object]:
        """Keep the attempt's outputs (rank 0's, of a multi-node job); the job's fields saying what was
        kept. Whatever goes wrong is the job's note, never its end."""
        work = self.p.runtime.work_dir(job.id, job.attempt)
        if work is None:
            return {}
        settings, tenant = self.p.settings, job.spec.tenant

        def quota() -> int:  # a read of the tenant's, only for an attempt that left outputs
            own = self.tenants.policy(tenant).outputs_quota
            return settings.outputs_quota_bytes if own is None else own

        try:
            root, group = settings.checkpoint_root, settings.storage_group
            outcome = kept_outputs.keep(
                work, job.spec.outputs, root, tenant, job.id, job.attempt, quota, group
            )
        except (OSError, ValueError, FleetError) as exc:
            outcome = kept_outputs.Outcome(None, f"outputs of attempt {job.attempt} not kept: {exc}")
        fields: dict[str, object] = {"outputs_note": outcome.note}
        if outcome.kept is not None:
            fields.update(outputs_bytes=outcome.kept.bytes, outputs_attempt=outcome.kept.attempt)
            event(log, "outputs_kept", job=job.id, attempt=job.attempt, bytes=outcome.kept.bytes)
        if outcome.note:
            event(log, "outputs_note", logging.WARNING, job=job.id, attempt=job.attempt, note=outcome.note)
        return fields

    def _latest(self, job: Job) -> str | None:
        try:
            return checkpoints.latest(checkpoints.job_dir(self.p.settings.checkpoint_root, job.id))
        except SpecError:  # an id that cannot be a path has no checkpoints
            return None

    def _await_gpus_released(self, job: Job) -> None:
        """Claims are released either way, but a GPU still holding a process is reported and
        published as busy by every heartbeat, so the scheduler does not hand it to the next job."""
        p = self.p
        stuck = await_released(p.inventory, p.runtime, job.gpus_on(self.node), p.cfg.gpu_release_timeout_s)
        if stuck:
            event(
                log,
                "gpu_not_released",
                logging.WARNING,
                job=job.id,
                attempt=job.attempt,
                gpus=";".join(f"{u}:{','.join(map(str, pids))}" for u, pids in stuck.items()),
            )
            p.publish()

    # -- time limits -----------------------------------------------------------------

    def enforce_time_limits(self, held: list[AttemptStatus], jobs: dict[str, Job]) -> None:
        """Stop each running attempt at its limit: SIGTERM ``signal_before`` ahead of it (the grace
        to checkpoint in), SIGKILL at it. Checked each reconcile (``reconcile_interval_s``); the
        exit then comes through :meth:`finish`, and :func:`settle` makes it a timeout."""
        now, timed_out = self.p.clock(), self.p.inflight.timed_out
        for status in held:
            job, key = jobs.get(status.job_id), (status.job_id, status.attempt)
            if job is None or job.attempt != status.attempt or job.state != JobState.RUNNING:
                continue
            deadline = time_limit(job)
            if not status.running or deadline is None or now < deadline or key in timed_out:
                continue
            timed_out.add(key)
            grace = job.spec.signal_before or self.p.cfg.stop_grace_s
            event(log, "time_limit", job=job.id, attempt=job.attempt, timeout=job.spec.timeout, grace_s=grace)
            threading.Thread(target=self.p.runtime.stop, args=(*key, grace), daemon=True).start()
