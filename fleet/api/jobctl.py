"""What a user does to jobs already submitted, as Slurm's ``scontrol`` and ``scancel`` do: hold and
release a queued job (or every queued task of a job array), update one (priority, GPUs, time
limit), cancel several at once (by ids, user, state), and queue the failed tasks of a job array
again. The API checks who may (tenant, owner) before calling these; the state changes are atomic
scripts (:mod:`fleet.state.control`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fleet.api.commands import Commands
from fleet.api.queries import known_id
from fleet.config import Settings
from fleet.errors import SpecError
from fleet.models import (
    ON_NODE_STATES,
    CancelReport,
    Job,
    JobSpec,
    JobState,
    Range,
    RequeueReport,
    TasksChanged,
)
from fleet.models.arrays import task_ids
from fleet.state import Stores
from fleet.state.control import JobControl, Need

#: what ``update`` may change, as the spec names it
UPDATABLE = ("priority", "gpus", "timeout")
#: the states ``requeue`` takes tasks from
REQUEUABLE = (JobState.FAILED, JobState.CANCELLED)
#: the states a cancel by state takes (any not final)
CANCELLABLE = (JobState.QUEUED, *ON_NODE_STATES)


class JobCommands(Commands):
    """:class:`Commands` and a user's control of submitted jobs."""

    def __init__(self, settings: Settings, stores: Stores, *, background_hints: bool = False) -> None:
        super().__init__(settings, stores, background_hints=background_hints)
        self._control = JobControl(stores.jobs)

    # -- hold, release, update ---------------------------------------------------------

    def hold(self, job_id: str, who: str) -> Job:
        """Keep a QUEUED job from being placed until :meth:`release`; it stays QUEUED, its reason
        "held by WHO". Holding a held job changes nothing; a job on a node or final is refused."""
        job = self._queued(job_id, "held", "it is past the queue: cancel it instead")
        changed = self._control.change_queued(
            job.id, time.time(), f"held by {who}", {"held_by": who}, Need.FREE
        )
        self._changed(job, changed.applied or changed.unmet, "held")
        return self._jobs.get(job.id)

    def release(self, job_id: str, who: str) -> Job:
        """Let a held job be placed again (a job not held is left as it is)."""
        job = self.get(job_id)
        if job.state != JobState.QUEUED or not job.held_by:
            return job
        changed = self._control.change_queued(
            job.id, time.time(), f"released by {who}", {"held_by": ""}, Need.HELD
        )
        self._changed(job, changed.applied or changed.unmet, "released")
        return self._jobs.get(job.id)

    def hold_array(self, array_id: str, who: str) -> TasksChanged:
        """:meth:`hold` every QUEUED task of a job array (each in an atomic step of its own)."""
        return self._array_tasks(array_id, f"held by {who}", {"held_by": who}, Need.FREE)

    def release_array(self, array_id: str, who: str) -> TasksChanged:
        """:meth:`release` every held task of a job array."""
        return self._array_tasks(array_id, f"released by {who}", {"held_by": ""}, Need.HELD)

    def _array_tasks(self, array_id: str, reason: str, fields: dict[str, str], need: Need) -> TasksChanged:
        array = self._arrays.get(known_id(array_id))
        outcome = self._control.change_many(
            task_ids(array.id, array.indices), time.time(), reason, fields, need
        )
        changed = [job_id for job_id, done in outcome if done.applied]
        self._hints.name(changed)
        report = TasksChanged(changed=len(changed))
        report.already = sum(1 for _, done in outcome if done.unmet)
        report.not_queued = len(outcome) - report.changed - report.already
        return report

    def update(self, job_id: str, changes: dict[str, Any], who: str) -> Job:
        """Change a QUEUED job's ``priority``, ``gpus`` or ``timeout``, checked as a submit checks its
        spec (the same validation and admission); it keeps its place in submission order. A job on a
        node may change only its ``timeout``: its agents read it each reconcile and stop the running
        attempt at the new limit (its GPUs are claimed, its place in the queue is past)."""
        given = {k: v for k, v in changes.items() if v is not None}
        if not given:
            raise SpecError(f"update: give at least one of {', '.join(UPDATABLE)}")
        unknown = sorted(set(given) - set(UPDATABLE))
        if unknown:
            raise SpecError(f"update: {unknown[0]}: cannot be changed; only {', '.join(UPDATABLE)}")
        job = self.get(job_id)
        if job.array_id is not None:
            raise SpecError(
                f"job {job.id} is task {job.array_index} of job array {job.array_id}, whose tasks share "
                "one spec: it cannot be changed alone (cancel it, or the array, and submit again)"
            )
        if job.state.on_node and set(given) == {"timeout"}:
            return self._update_on_node(job, given["timeout"], who)
        job = self._queued(
            job_id,
            "updated",
            "only its time limit (--timeout) can change on a node; for more, cancel it and submit it "
            "again (an elastic job: `fleet resize`)",
        )
        if "gpus" in given and isinstance(job.spec.gpus, Range):
            raise SpecError(
                f"gpus: job {job.id} is elastic ({job.spec.gpus} GPUs): size it with `fleet resize`"
            )
        spec = self.admit(JobSpec.parse({**job.spec.model_dump(mode="json"), **given}))
        if spec == job.spec:
            return job
        queue = f"{spec.priority} {spec.tenant}" if spec.priority != job.spec.priority else ""
        fields = {"spec": spec.model_dump_json()}
        changed = self._control.change_queued(
            job.id, time.time(), f"updated by {who}: {_said(job.spec, spec, given)}", fields, queue=queue
        )
        self._changed(job, changed.applied, "updated")
        return self._jobs.get(job.id)

    def _update_on_node(self, job: Job, timeout: object, who: str) -> Job:
        """A new time limit for the attempt on its nodes (raised or lowered; one already reached stops
        the attempt at the agents' next reconcile, as a timeout)."""
        spec = self.admit(JobSpec.parse({**job.spec.model_dump(mode="json"), "timeout": timeout}))
        if spec.timeout is None:
            raise SpecError(f"timeout: job {job.id} runs: give its new limit, e.g. 2h")
        if spec == job.spec:
            return job
        reason = f"updated by {who}: {_said(job.spec, spec, {'timeout': timeout})}"
        changed = self._control.set_time_limit(
            job.id, job.attempt, spec.model_dump_json(), reason, time.time()
        )
        if not changed.applied:
            raise SpecError(
                f"job {job.id} is {changed.state} now (its attempt {job.attempt} ended meanwhile): "
                "its time limit was not changed"
            )
        return self._jobs.get(job.id)

    def _queued(self, job_id: str, done: str, instead: str) -> Job:
        job = self.get(job_id)
        if job.state != JobState.QUEUED:
            where = "it has ended" if job.state.final else instead
            raise SpecError(f"job {job.id} is {job.state.value}: only a queued job can be {done} ({where})")
        return job

    def _changed(self, job: Job, applied: bool, done: str) -> None:
        """Wake the controller (it reads the job again), or say the job moved on meanwhile."""
        if not applied:
            state = self._jobs.get(job.id).state.value
            raise SpecError(f"job {job.id} is {state} now (it left the queue meanwhile): it cannot be {done}")
        self._notify_submitted(job.id)

    # -- cancel several ----------------------------------------------------------------

    def cancel_jobs(
        self,
        job_ids: Sequence[str] = (),
        *,
        user: str | None = None,
        state: str | None = None,
        tenant: str | None = None,
    ) -> CancelReport:
        """Cancel the jobs named (``job_ids``), or every job not yet final, that match all of ``user``
        (who submitted it), ``state`` (one not final) and ``tenant`` (the caller's, for a user). An id
        no such job holds (or another tenant's, for a user) is reported ``not_found``."""
        wanted = JobState.parse(state)
        if wanted is not None and wanted.final:
            raise SpecError(
                f"state {wanted.value}: a final job cannot be cancelled; give one of "
                f"{', '.join(s.value.lower() for s in CANCELLABLE)}"
            )
        if not job_ids and user is None and wanted is None:
            raise SpecError(
                "cancel: name the jobs (ids), or --user or --state to cancel by (never all at once)"
            )
        states = (wanted,) if wanted else CANCELLABLE
        if job_ids:
            ids = list(dict.fromkeys(known_id(j) for j in job_ids))
        else:
            ids = sorted(self.redis.sunion([self.stores.keys.jobs_in(s) for s in states]))
        jobs = {j.id: j for j in self._jobs.get_many(ids)}
        mine = [j for j in jobs.values() if tenant in (None, j.spec.tenant)]
        chosen = [
            j.id for j in sorted(mine, key=lambda j: j.seq) if user in (None, j.owner) and j.state in states
        ]
        report = self._cancel_many(chosen)
        visible = {j.id for j in mine}
        report.not_found = [j for j in ids if j not in visible] if job_ids else []
        report.already_final += sum(1 for j in mine if job_ids and j.id not in chosen and j.state.final)
        return report

    # -- requeue -----------------------------------------------------------------------

    def requeue(self, array_id: str, states: Sequence[str], who: str) -> RequeueReport:
        """Queue again the tasks of a job array that are in ``states`` (FAILED, CANCELLED), each under
        its own id and index: its next attempt, with a fresh retry budget, resuming from its last
        checkpoint as a requeue does. Tasks in other states are left as they are."""
        chosen = [JobState.parse(s) for s in states]
        if not chosen or any(s not in REQUEUABLE for s in chosen):
            raise SpecError(
                f"requeue: give the states to run again, of {', '.join(s.value for s in REQUEUABLE)}"
            )
        array = self._arrays.get(known_id(array_id))
        reason = f"requeued by {who}" if who else "requeued"
        outcome = self._control.requeue(
            task_ids(array.id, array.indices), [s for s in chosen if s], reason, time.time()
        )
        report = RequeueReport(requeued=[job_id for job_id, code, _ in outcome if code == 1])
        report.left = sum(1 for _, code, _ in outcome if code == 0)
        report.gone = sum(1 for _, code, _ in outcome if code == -1)
        self._hints.name(report.requeued)
        return report


def _said(old: JobSpec, new: JobSpec, given: dict[str, Any]) -> str:
    return ", ".join(f"{k} {_shown(getattr(old, k))} -> {_shown(getattr(new, k))}" for k in given)


def _shown(value: object) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
