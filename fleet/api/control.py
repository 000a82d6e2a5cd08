"""``/v1/jobs/.../hold``, ``release``, ``update``, ``/v1/jobs/cancel`` and ``/v1/arrays/.../hold``,
``release``, ``requeue``: a user's control of jobs already submitted (:mod:`fleet.api.jobctl`). A
user acts on its own jobs (cancels: any of its tenant's, as a single cancel does); operators and
admins on any tenant's."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from pydantic import Field

from fleet.api.deps import StrictBody, User, own_array, own_job, whom
from fleet.api.jobctl import JobCommands
from fleet.errors import Forbidden
from fleet.log import event
from fleet.models import CancelReport, Identity, Job, RequeueReport, Role, TasksChanged

log = logging.getLogger("fleet.api")


class Update(StrictBody):
    priority: int | None = None
    gpus: int | None = None
    #: seconds, or a duration as a spec takes it ("90m", "2h")
    timeout: float | str | None = None


class CancelJobs(StrictBody):
    ids: list[str] = Field(default_factory=list, max_length=10_000)
    user: str | None = None
    state: str | None = None


class Requeue(StrictBody):
    states: list[str] = Field(default_factory=lambda: ["FAILED"])


def routes(backend: JobCommands) -> APIRouter:
    router = APIRouter()

    def mine(who: Identity, job_id: str, done: str) -> Job:
        job = backend.get(job_id)
        own_job(who, job.spec.tenant, job_id)
        allowed(who, job.owner, f"job {job_id}", done)
        return job

    def mine_array(who: Identity, array_id: str, done: str) -> None:
        array = backend.array(array_id)
        own_array(who, array.spec.tenant, array_id)
        allowed(who, array.owner, f"job array {array_id}", done)

    @router.post("/v1/jobs/{job_id}/hold")
    def hold(job_id: str, who: User) -> Job:
        """Keep a queued job from being placed until released (it stays QUEUED, "held by USER")."""
        mine(who, job_id, "hold")
        job = backend.hold(job_id, who.user)
        event(log, "hold", job=job_id, user=who.user)
        return job

    @router.post("/v1/jobs/{job_id}/release")
    def release(job_id: str, who: User) -> Job:
        mine(who, job_id, "release")
        job = backend.release(job_id, who.user)
        event(log, "release", job=job_id, user=who.user)
        return job

    @router.post("/v1/arrays/{array_id}/hold")
    def hold_array(array_id: str, who: User) -> TasksChanged:
        """Hold every queued task of a job array (tasks on nodes or ended are counted, left as are)."""
        mine_array(who, array_id, "hold")
        report = backend.hold_array(array_id, who.user)
        event(log, "hold", array=array_id, user=who.user, tasks=report.changed)
        return report

    @router.post("/v1/arrays/{array_id}/release")
    def release_array(array_id: str, who: User) -> TasksChanged:
        mine_array(who, array_id, "release")
        report = backend.release_array(array_id, who.user)
        event(log, "release", array=array_id, user=who.user, tasks=report.changed)
        return report

    @router.post("/v1/jobs/{job_id}/update")
    def update(job_id: str, body: Update, who: User) -> Job:
        """Change a queued job's priority, GPUs or time limit (checked as a submit is); a job on a
        node, its time limit only."""
        mine(who, job_id, "update")
        job = backend.update(job_id, body.model_dump(), who.user)
        event(log, "update", job=job_id, user=who.user, **body.model_dump(exclude_none=True))
        return job

    @router.post("/v1/jobs/cancel")
    def cancel_jobs(body: CancelJobs, who: User) -> CancelReport:
        """Cancel the jobs named, or those of a user or in a state (within the caller's tenant)."""
        tenant = who.tenant if who.role == Role.USER else None
        report = backend.cancel_jobs(body.ids, user=body.user, state=body.state, tenant=tenant)
        event(
            log,
            "cancel_jobs",
            user=who.user,
            cancelled=len(report.cancelled),
            stopping=len(report.stopping),
            by_user=body.user,
            state=body.state,
        )
        return report

    @router.post("/v1/arrays/{array_id}/requeue")
    def requeue(array_id: str, body: Requeue, who: User) -> RequeueReport:
        """Run a job array's failed (or cancelled) tasks again, under the same ids."""
        mine_array(who, array_id, "requeue")
        report = backend.requeue(array_id, body.states, who.user)
        event(log, "requeue", array=array_id, user=who.user, tasks=len(report.requeued))
        return report

    return router


def allowed(who: Identity, owner: str, what: str, done: str) -> None:
    """A user may change only what it submitted; an operator or admin anything."""
    if who.role == Role.USER and owner != who.user:
        raise Forbidden(
            f"{what} was submitted by {owner or 'another user'!r}; {whom(who)} may {done} only its own "
            "(an operator may any)"
        )
