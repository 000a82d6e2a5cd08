"""``/v1/jobs`` and ``/v1/arrays``: submit, read, wait for, follow, cancel and resize jobs, each caller
within its tenant (an admin submits for any; operators and admins read and cancel any tenant's)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from fleet.api.commands import Commands
from fleet.api.deps import StrictBody, User, bearer, own, own_array, own_job, whom
from fleet.api.limits import PerToken
from fleet.api.queries import known_attempt
from fleet.api.waiting import ClientGone, Waiting, unless_gone
from fleet.errors import Forbidden, SpecError, at_index
from fleet.log import event
from fleet.models import (
    CancelReport,
    Event,
    Identity,
    Job,
    JobArray,
    JobSpec,
    LogLine,
    QueuePosition,
    Role,
    uploaded_profile,
)
from fleet.state.blobs import BlobStore
from fleet.state.profiles import not_uploaded

log = logging.getLogger("fleet.api")
#: the longest one ``wait`` call blocks; clients call again (proxies cut idle requests)
WAIT_MAX_S = 30.0
#: how often a log follower checks that its token is still valid while no line arrives
FOLLOW_POLL_S = 1.0
#: what a call whose client hung up "answers" (nobody reads it; nginx's name for it)
GONE = 499
#: most jobs one batch submit queues (more: several calls, or a job array for one spec many times)
MAX_BATCH = 1000


class SubmitJob(StrictBody):
    spec: dict[str, Any]
    id: str | None = None


class SubmitBatch(StrictBody):
    jobs: list[SubmitJob]


class Submitted(BaseModel):
    """A batch's job ids, in the order of its jobs."""

    ids: list[str]


class SubmitArray(StrictBody):
    spec: dict[str, Any]
    indices: str | list[int]
    max_running: int | None = None
    id: str | None = None


class Resize(StrictBody):
    gpus: int = Field(ge=0, le=1024)
    batch_size: int | None = Field(default=None, ge=1, le=1 << 24)


class CancelLabels(StrictBody):
    labels: dict[str, str]


def routes(backend: Commands, blobs: BlobStore, waits: PerToken, waiting: Waiting) -> APIRouter:  # noqa: C901 - one route per nested def
    router = APIRouter()

    def job_of(who: Identity, job_id: str) -> Job:
        job = backend.get(job_id)
        own_job(who, job.spec.tenant, job_id)
        return job

    def spec_for(who: Identity, raw: dict[str, Any]) -> JobSpec:
        """The spec, in the caller's tenant unless it names one: only an admin submits for another;
        its shipped directory, uploaded profile and a function's call uploaded already by the job's
        tenant or the caller's (an admin's), and kept another ``workdir_retention_s``. Another
        tenant's upload is refused as one never made, in the same words."""
        spec = JobSpec.parse({**raw, "tenant": raw.get("tenant", who.tenant)})
        tenants = (spec.tenant, who.tenant)
        if spec.workdir is not None and not blobs.use(spec.workdir, tenants):
            raise SpecError(
                f"workdir {spec.workdir}: not uploaded (or expired); PUT /v1/blobs/DIGEST first, "
                "as the CLI and Client do"
            )
        if spec.call is not None and not blobs.use(spec.call.blob, tenants):
            raise SpecError(
                f"call.blob {spec.call.blob}: not uploaded (or expired); PUT /v1/blobs/DIGEST first, "
                "as fleet.function's submit does"
            )
        if uploaded_profile(spec.profile or "") and not blobs.use(spec.profile or "", tenants):
            raise SpecError(not_uploaded(spec.profile or ""))
        size = None if spec.workdir is None else blobs.size(spec.workdir)
        if size != spec.workdir_size:  # what the upload held, never what the body says
            spec = spec.model_copy(update={"workdir_size": size})
        if spec.tenant != who.tenant and who.role != Role.ADMIN:
            raise Forbidden(
                f"{whom(who)} cannot submit to tenant {spec.tenant!r}: it acts for tenant {who.tenant!r} only"
            )
        if spec.tenant != who.tenant:
            backend.check_tenant(spec.tenant)
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

    @router.post("/v1/jobs/batch", status_code=201)
    def submit_batch(body: SubmitBatch, who: User) -> Submitted:
        """Queue up to ``MAX_BATCH`` jobs in one call; their ids in order. All or nothing: every spec
        is checked (tenant, mounts, image, shipped directory, ...) before any job is queued, and a
        refusal names the first bad one's index: ``jobs[3]: gpus: ...``."""
        if not body.jobs or len(body.jobs) > MAX_BATCH:
            raise SpecError(
                f"jobs: {len(body.jobs)} jobs in one batch; give 1 to {MAX_BATCH} (split a bigger one "
                "into several calls, or submit one spec many times as a job array)"
            )
        specs = [at_index(i, spec_for, who, item.spec) for i, item in enumerate(body.jobs)]
        ids = backend.submit_many(specs, job_ids=[item.id for item in body.jobs], owner=who.user)
        event(
            log,
            "submitted_batch",
            jobs=len(ids),
            first=ids[0],
            user=who.user,
            tenants=",".join(sorted({s.tenant for s in specs})),
        )
        return Submitted(ids=ids)

    @router.post("/v1/arrays", status_code=201)
    def submit_array(body: SubmitArray, who: User) -> JobArray:
        spec = spec_for(who, body.spec)
        if spec.stdin:
            raise SpecError("stdin: a job array's tasks read no forwarded input; drop stdin")
        array = backend.submit_array(
            spec, body.indices, max_running=body.max_running, array_id=body.id, owner=who.user
        )
        event(
            log, "submitted_array", array=array.id, size=array.size, user=who.user, tenant=array.spec.tenant
        )
        return array

    @router.get("/v1/jobs")
    def listing(
        who: User,
        state: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 100,
        tenant: str | None = None,
        user: str | None = None,
        label: Annotated[list[str] | None, Query(description="KEY=VALUE, repeated: all must match")] = None,
        flat: bool = False,
    ) -> list[Job | JobArray]:
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

    @router.get("/v1/jobs/{job_id}/wait", response_model=Job)
    async def wait(
        job_id: str, who: User, request: Request, timeout_s: Annotated[float, Query(ge=0)] = WAIT_MAX_S
    ) -> Job | Response:
        """The job once final, or as it is after ``timeout_s`` (at most 30): call again to go on.
        Waits on no thread and no Redis connection of its own; ends when its client hangs up."""
        await run_in_threadpool(job_of, who, job_id)
        with waits.hold(who, f"wait for {job_id}"):
            try:
                return await unless_gone(request.receive, waiting.wait(job_id, min(timeout_s, WAIT_MAX_S)))
            except ClientGone:
                return Response(status_code=GONE)

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
            raise Forbidden(
                f"job {job_id} was submitted by {job.owner or 'another user'!r}; {whom(who)} may "
                "resize only its own jobs (an operator may resize any)"
            )
        resized = backend.resize(job_id, body.gpus, body.batch_size, who=who.user)
        event(log, "resize", job=job_id, user=who.user, gpus=body.gpus, batch_size=body.batch_size)
        return resized

    @router.post("/v1/cancel")
    def cancel_labels(body: CancelLabels, who: User) -> CancelReport:
        """Cancel every job not yet final carrying all the labels (within the caller's tenant)."""
        return backend.cancel_labels(body.labels, tenant=who.tenant if who.role == Role.USER else None)

    @router.get("/v1/jobs/{job_id}/logs", response_model=None)
    async def logs(
        job_id: str,
        who: User,
        request: Request,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        rank: Annotated[int, Query(ge=0)] = 0,
        follow: bool = False,
    ) -> list[LogLine] | StreamingResponse:
        """The attempt's lines (default: the latest attempt); ``follow``: a stream of JSON lines that
        ends when the attempt is over, or once the caller's token is revoked or expires."""
        known_attempt(await run_in_threadpool(job_of, who, job_id), attempt)  # 404: no such attempt
        if not follow:
            return await run_in_threadpool(backend.logs, job_id, attempt, rank)
        token, tokens = bearer(request), request.app.state.tokens
        lines = waiting.follow(
            job_id, attempt, rank, FOLLOW_POLL_S, allowed=lambda: tokens.identify(token) is not None
        )
        waits.acquire(who, f"follow the logs of {job_id}")  # refused (429) before the answer starts
        return Followed(_ndjson(lines), release=lambda: waits.release(who))

    @router.get("/v1/arrays/{array_id}")
    def array(array_id: str, who: User) -> JobArray:
        found = backend.array(array_id)
        own_array(who, found.spec.tenant, array_id)
        return found

    @router.post("/v1/arrays/{array_id}/cancel")
    def cancel_array(array_id: str, who: User) -> CancelReport:
        own_array(who, backend.array(array_id).spec.tenant, array_id)
        return backend.cancel_array(array_id)

    return router


def _labels(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SpecError(f"label {bad[0]!r}: expected KEY=VALUE")
    return dict(p.split("=", 1) for p in pairs)


async def _ndjson(lines: AsyncGenerator[LogLine, None]) -> AsyncGenerator[bytes, None]:
    try:
        async for line in lines:
            yield (line.model_dump_json() + "\n").encode()
    finally:
        await lines.aclose()


class Followed(StreamingResponse):
    """A followed log: it stops as soon as its client hangs up, the follower dropped from the stream
    read and its token's slot given back (``release``), whichever ASGI version the server speaks."""

    def __init__(self, content: AsyncGenerator[bytes, None], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="application/x-ndjson")
        self._content, self._release = content, release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_gone(receive, self.stream_response(send))
        except ClientGone:
            pass
        finally:
            self._release()
            await self._content.aclose()
