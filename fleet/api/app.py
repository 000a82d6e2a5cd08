"""``fleet api``: the front door. Every call names a bearer token; the API checks who it is, what
its role allows and which tenant it acts for, then calls :class:`fleet.backend.Backend`.

Stateless: every answer comes from Redis, so several servers may run behind a load balancer.
It also serves the read-only status pages under ``/ui`` (:mod:`fleet.api.pages`).
Blocking calls (waiting for a job, following a log) run on worker threads, each holding one
Redis read at a time; ``api_threads`` bounds how many run at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from fleet import __version__
from fleet.api import pages, webhooks
from fleet.api.deps import Admin, Anyone, Operator, User, own, whom
from fleet.backend import Backend
from fleet.config import Settings
from fleet.errors import (
    CorruptRecord,
    FleetError,
    Forbidden,
    JobExpired,
    JobTimeout,
    NotFound,
    SpecError,
    StoreUnavailable,
    Unauthorized,
)
from fleet.keys import Keys
from fleet.log import event
from fleet.models import (
    CancelReport,
    Event,
    Identity,
    Job,
    JobArray,
    JobSpec,
    LogLine,
    Node,
    QueuePosition,
    Role,
    Tenant,
    TenantStatus,
    TokenInfo,
)
from fleet.state.blobs import BlobStore
from fleet.state.connection import connect_binary
from fleet.state.tenants import TenantStore
from fleet.state.tokens import TokenStore
from fleet.state.webhooks import WebhookStore
from fleet.workdir import check_digest, digest_of

log = logging.getLogger("fleet.api")
#: the longest one ``wait`` call blocks; clients call again (proxies cut idle requests)
WAIT_MAX_S = 30.0
#: how long a log follower's read blocks before it checks whether the attempt is over
FOLLOW_POLL_S = 1.0

STATUS: dict[type[FleetError], int] = {
    Unauthorized: 401,
    Forbidden: 403,
    JobExpired: 410,
    CorruptRecord: 409,
    NotFound: 404,
    SpecError: 400,
    JobTimeout: 408,
    StoreUnavailable: 503,
}


def status_of(exc: FleetError) -> int:
    return next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 400)


def error_body(exc: FleetError) -> dict[str, Any]:
    """What a client needs to raise the same error: its type, message and exit code."""
    body: dict[str, Any] = {"error": type(exc).__name__, "detail": str(exc), "exit_code": exc.exit_code}
    if isinstance(exc, JobExpired):
        body["expired"] = {"job_id": exc.job_id, "state": exc.state, "ended_at": exc.ended_at,
                           "expired_at": exc.expired_at}  # fmt: skip
    return body


# -- request bodies --------------------------------------------------------------------------


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


class Cordon(BaseModel):
    reason: str = Field(default="", max_length=1024)


class Drain(BaseModel):
    names: list[str] = Field(min_length=1, max_length=10_000)
    deadline_s: float = Field(default=3600.0, ge=0)
    grace_s: float = Field(default=60.0, ge=0)
    force: bool = False
    reason: str = Field(default="", max_length=1024)


class NewToken(BaseModel):
    user: str
    tenant: str
    role: Role = Role.USER
    expires_in_s: float | None = Field(default=None, gt=0)


class IssuedToken(BaseModel):
    token: str
    info: TokenInfo


class Quarantine(BaseModel):
    jobs: dict[str, str]
    nodes: dict[str, str]


class FleetInfo(BaseModel):
    version: str
    most_gpus: int


# -- the app ---------------------------------------------------------------------------------


def create_app(settings: Settings) -> FastAPI:  # noqa: C901 - one route per nested def
    backend = Backend(settings=settings)
    tokens = TokenStore(backend.redis, Keys(settings.key_prefix))
    tenants = TenantStore(backend.redis, Keys(settings.key_prefix))
    blobs = BlobStore(connect_binary(settings), Keys(settings.key_prefix), settings.workdir_retention_s)
    hooks = WebhookStore(backend.redis, Keys(settings.key_prefix))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api.threads
        yield
        backend.close()

    app = FastAPI(title="fleet", version=__version__, lifespan=lifespan,
                  description="A serverless-style job queue for your own GPU fleet.")  # fmt: skip
    app.state.tokens = tokens

    @app.exception_handler(FleetError)
    async def fleet_error(request: Request, exc: FleetError) -> Response:
        if pages.is_page(request):
            return pages.error_page(request, exc, status_of(exc))
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return error_response(SpecError(f"bad request: {fields}"))

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

    # -- jobs --------------------------------------------------------------------------------

    @app.post("/v1/jobs", status_code=201)
    def submit(body: SubmitJob, who: User) -> Job:
        job = backend.submit(spec_for(who, body.spec), job_id=body.id, owner=who.user)
        event(log, "submitted", job=job.id, user=who.user, tenant=job.spec.tenant)
        return job

    @app.post("/v1/arrays", status_code=201)
    def submit_array(body: SubmitArray, who: User) -> JobArray:
        array = backend.submit_array(spec_for(who, body.spec), body.indices, max_running=body.max_running,
                                     array_id=body.id, owner=who.user)  # fmt: skip
        event(
            log, "submitted_array", array=array.id, size=array.size, user=who.user, tenant=array.spec.tenant
        )
        return array

    @app.get("/v1/jobs")
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

    @app.get("/v1/jobs/{job_id}")
    def get(job_id: str, who: User) -> Job:
        return job_of(who, job_id)

    @app.get("/v1/jobs/{job_id}/position")
    def position(job_id: str, who: User) -> QueuePosition | None:
        """Where a QUEUED job stands (null otherwise): in its tenant's queue and in the whole queue."""
        job_of(who, job_id)
        return backend.position(job_id)

    @app.get("/v1/jobs/{job_id}/history")
    def history(job_id: str, who: User) -> list[Event]:
        job_of(who, job_id)
        return backend.history(job_id)

    @app.get("/v1/jobs/{job_id}/wait")
    def wait(job_id: str, who: User, timeout_s: Annotated[float, Query(ge=0)] = WAIT_MAX_S) -> Job:
        """The job once final, or as it is after ``timeout_s`` (at most 30): call again to go on."""
        job_of(who, job_id)
        try:
            return backend.wait(job_id, min(timeout_s, WAIT_MAX_S))
        except JobTimeout:
            return backend.get(job_id)

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, who: User) -> Job:
        job_of(who, job_id)
        job = backend.cancel(job_id)
        event(log, "cancel", job=job_id, user=who.user)
        return job

    @app.post("/v1/jobs/{job_id}/resize")
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

    @app.post("/v1/cancel")
    def cancel_labels(body: CancelLabels, who: User) -> CancelReport:
        """Cancel every job not yet final carrying all the labels (within the caller's tenant)."""
        return backend.cancel_labels(body.labels, tenant=who.tenant if who.role == Role.USER else None)

    @app.get("/v1/jobs/{job_id}/logs", response_model=None)
    def logs(
        job_id: str, who: User, attempt: Annotated[int | None, Query(ge=1)] = None,
        rank: Annotated[int, Query(ge=0)] = 0, follow: bool = False,
    ) -> list[LogLine] | StreamingResponse:  # fmt: skip
        """The attempt's lines (default: the latest attempt); ``follow``: a stream of JSON lines that
        ends when the attempt is over."""
        job_of(who, job_id)
        if not follow:
            return backend.logs(job_id, attempt, rank)
        lines = backend.follow_logs(job_id, attempt, FOLLOW_POLL_S, rank)
        return StreamingResponse(_ndjson(lines), media_type="application/x-ndjson")

    @app.get("/v1/arrays/{array_id}")
    def array(array_id: str, who: User) -> JobArray:
        found = backend.array(array_id)
        own(who, found.spec.tenant, f"job array {array_id}")
        return found

    @app.post("/v1/arrays/{array_id}/cancel")
    def cancel_array(array_id: str, who: User) -> CancelReport:
        own(who, backend.array(array_id).spec.tenant, f"job array {array_id}")
        return backend.cancel_array(array_id)

    # -- shipped directories -----------------------------------------------------------------

    @app.head("/v1/blobs/{digest}")
    def blob_exists(digest: str, _: User) -> Response:
        """200 when the fleet holds it (and keeps it another ``workdir_retention_s``), else 404."""
        return Response(status_code=200 if blobs.touch(digest) else 404)

    @app.put("/v1/blobs/{digest}", status_code=201)
    async def blob_put(digest: str, request: Request, _: User) -> dict[str, Any]:
        """A packed directory (tar.gz) named by the SHA-256 of its bytes, at most ``workdir_max_bytes``."""
        check_digest(digest)
        limit = settings.workdir_max_bytes
        declared = int(request.headers.get("content-length") or 0)
        if declared > limit:
            raise SpecError(f"workdir: {declared} bytes packed, more than workdir_max_bytes ({limit}); leave "
                            "data, checkpoints and environments out with a .fleetignore")  # fmt: skip
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise SpecError(f"workdir: more than workdir_max_bytes ({limit}) packed")
        if digest_of(bytes(data)) != digest:
            raise SpecError(f"workdir: the bytes sent do not hash to {digest}")
        created = await anyio.to_thread.run_sync(blobs.put, digest, bytes(data))
        return {"digest": digest, "bytes": len(data), "created": created}

    # -- nodes -------------------------------------------------------------------------------

    @app.get("/v1/nodes")
    def nodes(_: User) -> list[Node]:
        return backend.nodes()

    @app.get("/v1/nodes/{name}")
    def node(name: str, _: User) -> Node:
        return backend.node(name)

    @app.post("/v1/nodes/{name}/cordon")
    def cordon(name: str, who: Operator, body: Annotated[Cordon | None, Body()] = None) -> Node:
        return backend.cordon(name, body.reason if body else "", who=who.user)

    @app.post("/v1/nodes/{name}/uncordon")
    def uncordon(name: str, who: Operator) -> Node:
        return backend.uncordon(name, who=who.user)

    @app.post("/v1/drain")
    def drain(body: Drain, who: Operator) -> list[Node]:
        return backend.drain(body.names, deadline_s=body.deadline_s, grace_s=body.grace_s, force=body.force,
                             reason=body.reason, who=who.user)  # fmt: skip

    @app.get("/v1/quarantine")
    def quarantine(who: User) -> Quarantine:
        """Records fleet cannot read. A user sees only the nodes': an unreadable job names no tenant."""
        jobs = backend.quarantined_jobs() if who.role.allows(Role.OPERATOR) else {}
        return Quarantine(jobs=jobs, nodes=backend.quarantined_nodes())

    @app.get("/v1/fleet")
    def fleet_info(_: User) -> FleetInfo:
        return FleetInfo(version=__version__, most_gpus=backend.most_gpus())

    # -- tenants -----------------------------------------------------------------------------

    @app.get("/v1/tenants")
    def tenant_list(who: User) -> list[TenantStatus]:
        """Every tenant's policy, use, fair share and decayed usage: what anyone waiting may see, to
        know why (no job of another tenant is named, nor another tenant's webhook URL)."""
        return [webhooks.redacted(t, who.tenant, who.role == Role.ADMIN) for t in tenants.status()]

    @app.put("/v1/tenants/{name}")
    def tenant_set(name: str, body: dict[str, Any], who: Admin) -> Tenant:
        tenant = Tenant.parse({**body, "name": name})
        tenants.set(tenant)
        event(log, "tenant_set", tenant=name, by=who.user, **tenant.model_dump(exclude={"name"}))
        return tenant

    @app.delete("/v1/tenants/{name}")
    def tenant_delete(name: str, who: Admin) -> Tenant:
        """Forget a tenant's policy: its jobs get the default one (no guarantee, no limit, weight 1)."""
        tenant = tenants.get(name)
        tenants.delete(name)
        event(log, "tenant_deleted", tenant=name, by=who.user)
        return tenant

    # -- identities --------------------------------------------------------------------------

    @app.get("/v1/whoami")
    def whoami(who: Anyone) -> Identity:
        return who

    @app.post("/v1/tokens", status_code=201)
    def create_token(body: NewToken, who: Admin) -> IssuedToken:
        token, info = tokens.create(body.user, body.tenant, body.role, expires_in_s=body.expires_in_s,
                                    created_by=who.user)  # fmt: skip
        event(
            log, "token_created", id=info.id, user=info.user, tenant=info.tenant, role=info.role, by=who.user
        )
        return IssuedToken(token=token, info=info)

    @app.get("/v1/tokens")
    def list_tokens(_: Admin) -> list[TokenInfo]:
        return tokens.all()

    @app.delete("/v1/tokens/{token_id}")
    def revoke_token(token_id: str, who: Admin) -> TokenInfo:
        found = next((t for t in tokens.all() if t.id == token_id), None)
        if found is None or not tokens.revoke(token_id):
            raise NotFound(f"no token {token_id!r} (fleet token list shows them)")
        event(log, "token_revoked", id=token_id, by=who.user)
        return found

    app.include_router(webhooks.routes(hooks))
    app.include_router(pages.page_routes(backend, tenants))
    return app


def _labels(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SpecError(f"label {bad[0]!r}: expected KEY=VALUE")
    return dict(p.split("=", 1) for p in pairs)


def error_response(exc: FleetError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    return JSONResponse(error_body(exc), status_code=status_of(exc), headers=headers)


def _ndjson(lines: Iterator[LogLine]) -> Iterator[bytes]:
    for line in lines:
        yield (line.model_dump_json() + "\n").encode()
