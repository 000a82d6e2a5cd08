"""``/v1/jobs`` and ``/v1/arrays``: submit, read, wait for, follow, cancel and resize jobs, each caller
within its tenant (an admin submits for any; operators and admins read and cancel any tenant's)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from fleet.api.deps import User, bearer, own, whom
from fleet.api.limits import PerToken
from fleet.backend import Backend
from fleet.errors import Forbidden, JobTimeout, SpecError
from fleet.log import event
from fleet.models import CancelReport, Event, Identity, Job, JobArray, JobSpec, LogLine, QueuePosition, Role
from fleet.state.blobs import BlobStore

log = logging.getLogger("fleet.api")
#: the longest one ``wait`` call blocks; clients call again (proxies cut idle requests)
WAIT_MAX_S = 30.0
#: how long a log follower's read blocks before it checks whether the attempt is over
FOLLOW_POLL_S = 1.0


class SubmitJob(BaseModel):
    spec: dict[str, Any]
    id: str | None = None


class SubmitArray(BaseModel):
    spec: dict[str, Any]
    indices: str | list[int]
    max_running: int | None = None
    id: str | None = None


class Resize(BaseModel):
    gpus: int = Field(ge=0, le=1024)
    batch_size: int | None = Field(default=None, ge=1, le=1 << 24)


class CancelLabels(BaseModel):
    labels: dict[str, str]


def routes(backend: Backend, blobs: BlobStore, waits: PerToken) -> APIRouter:  # noqa: C901 - one route per nested def
    router = APIRouter()

    def job_of(who: Identity, job_id: str) -> Job:
        job = backend.get(job_id)
        own(who, job.spec.tenant, f"job {job_id}")
        return job

    def spec_for(who: Identity, raw: dict[str, Any]) -> JobSpec:
        """The spec, in the caller's tenant unless it names one: only an admin submits for another;
        its shipped directory uploaded already (and kept another ``workdir_retention_s``)."""
        spec = JobSpec.parse({**raw, "tenant": raw.get("tenant", who.tenant)})
        if spec.workdir is not None and not blobs.touch(spec.workdir):
            raise SpecError(f"workdir {spec.workdir}: not uploaded (or expired); PUT /v1/blobs/DIGEST first, "
                            "as the CLI and Client do")  # fmt: skip
        if spec.tenant != who.tenant and who.role != Role.ADMIN:
            raise Forbidden(f"{whom(who)} cannot submit to tenant {spec.tenant!r}: it acts for "
                            f"tenant {who.tenant!r} only")  # fmt: skip
        return spec

    def tenant_filter(who: Identity, tenant: str | None) -> str | None:
        if who.role == Role.USER:
            if tenant not in (None, who.tenant):
                own(who, tenant or "", f"the job list of tenant {tenant!r}")
            return who.tenant
        return tenant

    @router.post("/v1/jobs", status_code=201)
    def submit(body: SubmitJob, who: User) -> Job:
        job = backend.submit(spec_for(who, body.spec), job_id=body.id, owner=who.user)
        event(log, "submitted", job=job.id, user=who.user, tenant=job.spec.tenant)
        return job

    @router.post("/v1/arrays", status_code=201)
    def submit_array(body: SubmitArray, who: User) -> JobArray:
        array = backend.submit_array(spec_for(who, body.spec), body.indices, max_running=body.max_running,
                                     array_id=body.id, owner=who.user)  # fmt: skip
        event(
            log, "submitted_array", array=array.id, size=array.size, user=who.user, tenant=array.spec.tenant
        )
        return array

    @router.get("/v1/jobs")
    def listing(
        who: User, state: str | None = None, limit: Annotated[int, Query(ge=1, le=100_000)] = 100,
        tenant: str | None = None, user: str | None = None,
        label: Annotated[list[str] | None, Query(description="KEY=VALUE, repeated: all must match")] = None,
        flat: bool = False,
    ) -> list[Job | JobArray]:  # fmt: skip
        """Newest first; each array one entry (``flat``: every job, tasks included)."""
        scope, labels = tenant_filter(who, tenant), _labels(label or [])
        if flat:
            return list(backend.jobs(state, limit, scope, user, labels))
        return backend.listing(state, limit, scope, user, labels)

    @router.get("/v1/jobs/{job_id}")
    def get(job_id: str, who: User) -> Job:
        return job_of(who, job_id)

    @router.get("/v1/jobs/{job_id}/position")
    def position(job_id: str, who: User) -> QueuePosition | None:
        """Where a QUEUED job stands (null otherwise): in its tenant's queue and in the whole queue."""
        job_of(who, job_id)
        return backend.position(job_id)

    @router.get("/v1/jobs/{job_id}/history")
    def history(job_id: str, who: User) -> list[Event]:
        job_of(who, job_id)
        return backend.history(job_id)

    @router.get("/v1/jobs/{job_id}/wait")
    def wait(job_id: str, who: User, timeout_s: Annotated[float, Query(ge=0)] = WAIT_MAX_S) -> Job:
        """The job once final, or as it is after ``timeout_s`` (at most 30): call again to go on."""
        job_of(who, job_id)
        with waits.hold(who, f"wait for {job_id}"):
            try:
                return backend.wait(job_id, min(timeout_s, WAIT_MAX_S))
            except JobTimeout:
                return backend.get(job_id)

    @router.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, who: User) -> Job:
        job_of(who, job_id)
        job = backend.cancel(job_id)
        event(log, "cancel", job=job_id, user=who.user)
        return job

    @router.post("/v1/jobs/{job_id}/resize")
    def resize(job_id: str, body: Resize, who: User) -> Job:
        """Resize an elastic job within its range: its owner, or an operator (any tenant's job). A running
        job checkpoints on SIGTERM and starts again at the new size, spending no retry."""
        job = job_of(who, job_id)
        if who.role == Role.USER and job.owner != who.user:
            raise Forbidden(f"job {job_id} was submitted by {job.owner or 'another user'!r}; {whom(who)} may "
                            "resize only its own jobs (an operator may resize any)")  # fmt: skip
        resized = backend.resize(job_id, body.gpus, body.batch_size, who=who.user)
        event(log, "resize", job=job_id, user=who.user, gpus=body.gpus, batch_size=body.batch_size)
        return resized

    @router.post("/v1/cancel")
    def cancel_labels(body: CancelLabels, who: User) -> CancelReport:
        """Cancel every job not yet final carrying all the labels (within the caller's tenant)."""
        return backend.cancel_labels(body.labels, tenant=who.tenant if who.role == Role.USER else None)

    @router.get("/v1/jobs/{job_id}/logs", response_model=None)
    def logs(
        job_id: str, who: User, request: Request, attempt: Annotated[int | None, Query(ge=1)] = None,
        rank: Annotated[int, Query(ge=0)] = 0, follow: bool = False,
    ) -> list[LogLine] | StreamingResponse:  # fmt: skip
        """The attempt's lines (default: the latest attempt); ``follow``: a stream of JSON lines that
        ends when the attempt is over, or once the caller's token is revoked or expires."""
        job_of(who, job_id)
        if not follow:
            return backend.logs(job_id, attempt, rank)
        token, tokens = bearer(request), request.app.state.tokens
        lines = backend.follow_logs(
            job_id, attempt, FOLLOW_POLL_S, rank, allowed=lambda: tokens.identify(token) is not None
        )
        stream = waits.holding(who, f"follow the logs of {job_id}", _ndjson(lines))
        return StreamingResponse(stream, media_type="application/x-ndjson")

    @router.get("/v1/arrays/{array_id}")
    def array(array_id: str, who: User) -> JobArray:
        found = backend.array(array_id)
        own(who, found.spec.tenant, f"job array {array_id}")
        return found

    @router.post("/v1/arrays/{array_id}/cancel")
    def cancel_array(array_id: str, who: User) -> CancelReport:
        own(who, backend.array(array_id).spec.tenant, f"job array {array_id}")
        return backend.cancel_array(array_id)

    return router


def _labels(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SpecError(f"label {bad[0]!r}: expected KEY=VALUE")
    return dict(p.split("=", 1) for p in pairs)


def _ndjson(lines: Iterator[LogLine]) -> Iterator[bytes]:
    for line in lines:
        yield (line.model_dump_json() + "\n").encode()
