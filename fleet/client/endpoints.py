"""Every call of the fleet API, declared once: its method, path, request body or query (arguments
checked before anything is sent) and how its answer is read. :class:`fleet.Client` sends these one
by one, :class:`fleet.AsyncClient` awaits the same ones; a new endpoint is one function here and a
one-line method on each client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from fleet.client import checks
from fleet.errors import SpecError
from fleet.models import (
    FROM_FLEET,
    CancelReport,
    Event,
    FleetVersions,
    Identity,
    Job,
    JobArray,
    JobSpec,
    JobState,
    LogLine,
    Node,
    QueuePosition,
    RequeueReport,
    Role,
    Tenant,
    TenantStatus,
    TokenInfo,
    WebhookOutcome,
    check_job_id,
    relative_path,
)
from fleet.models.usage import GROUPINGS, History, parse_when

R = TypeVar("R")
#: most jobs one :meth:`fleet.Client.submit_many` call queues (the API's ``MAX_BATCH``)
MAX_BATCH = 1000
#: what the API returns, fleet stored: an array task's spec carries the fleet.* labels a submit may not
_STORED = {FROM_FLEET: True}


@dataclass(frozen=True)
class Call(Generic[R]):
    """One request, and how its JSON answer becomes what the client returns."""

    method: str
    path: str
    parse: Callable[[Any], R]
    body: Any = None
    query: dict[str, Any] | None = None
    timeout: float | None = None


# -- jobs ------------------------------------------------------------------------------


def submit(spec: dict[str, Any], job_id: str | None) -> Call[Job]:
    if job_id is not None:
        check_job_id(job_id)
    return Call("POST", "/v1/jobs", job, {"spec": spec, "id": job_id})


def check_batch(count: int, job_ids: Sequence[str | None] | None) -> list[str | None]:
    """The ids of a batch of ``count`` jobs (None: fleet picks), each checked: before anything is
    shipped or sent."""
    ids: list[str | None] = list(job_ids) if job_ids is not None else [None] * count
    if not count or count > MAX_BATCH:
        raise SpecError(
            f"submit_many: {count} specs; give 1 to {MAX_BATCH} a call (or submit one spec "
            "many times as a job array)"
        )
    if len(ids) != count:
        raise SpecError(f"job_ids: {len(ids)} ids for {count} specs; give one per spec (or None)")
    for i, job_id in enumerate(ids):
        if job_id is not None:
            try:
                check_job_id(job_id)
            except SpecError as exc:
                raise SpecError(f"jobs[{i}]: {exc}") from None
    return ids


def submit_batch(specs: Sequence[dict[str, Any]], job_ids: Sequence[str | None] | None) -> Call[list[str]]:
    """Up to ``MAX_BATCH`` jobs queued all or nothing; their ids in order."""
    ids = check_batch(len(specs), job_ids)
    body = {"jobs": [{"spec": s, "id": i} for s, i in zip(specs, ids, strict=True)]}
    return Call("POST", "/v1/jobs/batch", lambda data: [str(i) for i in data["ids"]], body)


def submit_array(
    spec: dict[str, Any], indices: str | Iterable[int], max_running: int | None, array_id: str | None
) -> Call[JobArray]:
    body = {"spec": spec, "indices": checks.indices(indices), "max_running": max_running, "id": array_id}
    return Call("POST", "/v1/arrays", array, body)


def get(job_id: str) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{_job_segment(job_id)}", job)


def get_array(array_id: str) -> Call[JobArray]:
    return Call("GET", f"/v1/arrays/{_segment(checks.ident(array_id, 'array id'))}", array)


def listing(query: dict[str, Any]) -> Call[list[Job | JobArray]]:
    """Jobs and arrays (one entry each); ``query`` from :func:`filters`."""
    return Call("GET", "/v1/jobs", _entries, query=query)


def jobs(query: dict[str, Any]) -> Call[list[Job]]:
    """Every job, array tasks one by one; ``query`` from :func:`filters`."""
    return Call("GET", "/v1/jobs", lambda rows: [job(r) for r in rows], query=query | {"flat": "true"})


def quarantined(what: str) -> Call[dict[str, str]]:
    """``what``: "jobs" or "nodes"."""
    return Call("GET", "/v1/quarantine", lambda data: dict(data[what]))


def position(job_id: str) -> Call[QueuePosition | None]:
    return Call(
        "GET",
        f"/v1/jobs/{_job_segment(job_id)}/position",
        lambda data: None if data is None else QueuePosition.model_validate(data),
    )


def history(job_id: str) -> Call[list[Event]]:
    return Call("GET", f"/v1/jobs/{_job_segment(job_id)}/history", _list(Event))


def cancel(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{_job_segment(job_id)}/cancel", job)


def resize(job_id: str, gpus: int, batch_size: int | None) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{_segment(job_id)}/resize", job, {"gpus": gpus, "batch_size": batch_size})


def cancel_array(array_id: str) -> Call[CancelReport]:
    path = f"/v1/arrays/{_segment(checks.ident(array_id, 'array id'))}/cancel"
    return Call("POST", path, CancelReport.model_validate)


def cancel_labels(labels: dict[str, str]) -> Call[CancelReport]:
    if not checks.labels(labels):
        raise SpecError("cancel by label: give at least one label KEY=VALUE")
    return Call("POST", "/v1/cancel", CancelReport.model_validate, {"labels": labels})


def hold(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{_job_segment(job_id)}/hold", job)


def release(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{_job_segment(job_id)}/release", job)


def update(job_id: str, priority: int | None, gpus: int | None, timeout: float | str | None) -> Call[Job]:
    if priority is None and gpus is None and timeout is None:
        raise SpecError("update: give at least one of priority, gpus, timeout")
    body = {"priority": priority, "gpus": gpus, "timeout": timeout}
    return Call("POST", f"/v1/jobs/{_job_segment(job_id)}/update", job, body)


def cancel_jobs(job_ids: Sequence[str], user: str | None, state: str | None) -> Call[CancelReport]:
    """Cancel the jobs named, or by who submitted them and their state (all must match)."""
    ids = [checks.ident(j) for j in job_ids]
    if not ids and user is None and state is None:
        raise SpecError("cancel: name the jobs (ids), or a user or state to cancel by (never all at once)")
    body = {"ids": ids, "user": user, "state": None if state is None else str(JobState.parse(state))}
    return Call("POST", "/v1/jobs/cancel", CancelReport.model_validate, body)


def requeue(array_id: str, failed: bool, cancelled: bool) -> Call[RequeueReport]:
    states = [s for s, given in (("FAILED", failed), ("CANCELLED", cancelled)) if given]
    if not states:
        raise SpecError("requeue: say which tasks to run again: failed, cancelled or both")
    path = f"/v1/arrays/{_segment(checks.ident(array_id, 'array id'))}/requeue"
    return Call("POST", path, RequeueReport.model_validate, {"states": states})


def wait_once(job_id: str, left: float, timeout: float) -> Call[Job]:
    """The job once final, or as it stands after ``left`` seconds (at most 30: call again)."""
    return Call(
        "GET",
        f"/v1/jobs/{_job_segment(job_id)}/wait",
        job,
        query={"timeout_s": f"{left:.3f}"},
        timeout=left + timeout,
    )


def logs(job_id: str, attempt: int | None, rank: int) -> Call[list[LogLine]]:
    query = {"attempt": checks.attempt(attempt), "rank": checks.count(rank, "rank", 0, 64)}
    return Call("GET", f"/v1/jobs/{_job_segment(job_id)}/logs", _list(LogLine), query=query)


def follow(job_id: str, attempt: int | None, rank: int) -> tuple[str, dict[str, Any]]:
    """Path and query of a followed log (a stream of JSON lines), arguments checked."""
    query = {"attempt": checks.attempt(attempt), "rank": checks.count(rank, "rank", 0, 64), "follow": "true"}
    return f"/v1/jobs/{_job_segment(job_id)}/logs", query


def download(job_id: str, path: str | None, checkpoint: str | None) -> tuple[str, dict[str, Any]]:
    """Path and query of a job's kept outputs (under ``path``) or of one of its checkpoints (a
    gzipped tar), arguments checked before anything is sent."""
    segment = _job_segment(job_id)
    if checkpoint is not None:
        if path:
            raise SpecError("path: give a path or a checkpoint, not both")
        if not checkpoint or "/" in checkpoint or checkpoint in (".", ".."):
            raise SpecError(f"checkpoint {checkpoint!r}: give 'latest' or a checkpoint's file name")
        return f"/v1/jobs/{segment}/checkpoint", {"name": checkpoint}
    try:
        inner = relative_path(path or "", "path: give a path inside the job's outputs, without '..'")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return f"/v1/jobs/{segment}/outputs", {"path": inner or None}


def filters(
    state: JobState | str | None,
    limit: int,
    tenant: str | None,
    user: str | None,
    labels: dict[str, str] | None,
) -> dict[str, Any]:
    """The query of a job listing, each filter checked."""
    labels = checks.labels(labels)
    pairs = None if not labels else [f"{k}={v}" for k, v in labels.items()]
    for what, value in (("tenant", tenant), ("user", user)):
        if value is not None:
            checks.ident(value, what)
    parsed = JobState.parse(state)
    return {
        "state": None if parsed is None else str(parsed),
        "limit": checks.count(limit, "limit"),
        "tenant": tenant,
        "user": user,
        "label": pairs,
    }


def usage(
    since: float | str, until: float | str | None, tenant: str | None, user: str | None, by: str, limit: int
) -> Call[History]:
    """Accounting: what jobs that ended in [since, until) used (times: Unix seconds, or as
    :func:`fleet.models.usage.parse_when` reads them: ``30d``, ``2025-01-31``)."""
    now = time.time()
    start = parse_when(since, now, "since") if isinstance(since, str) else float(since)
    end = parse_when(until, now, "until") if isinstance(until, str) else until
    if by not in GROUPINGS:
        raise SpecError(f"by {by!r}: expected one of {', '.join(GROUPINGS)}")
    for what, value in (("tenant", tenant), ("user", user)):
        if value is not None:
            checks.ident(value, what)
    query = {"since": start, "until": end, "tenant": tenant, "user": user, "by": by}
    return Call(
        "GET", "/v1/history", History.model_validate, query=query | {"limit": checks.count(limit, "limit")}
    )


# -- blobs (shipped directories, scaling profiles) --------------------------------------


def blob_path(digest: str) -> str:
    return f"/v1/blobs/{digest}"


# -- nodes -----------------------------------------------------------------------------


def nodes() -> Call[list[Node]]:
    return Call("GET", "/v1/nodes", _list(Node))


def most_gpus() -> Call[int]:
    return Call("GET", "/v1/fleet", lambda data: int(data["most_gpus"]))


def versions() -> Call[FleetVersions]:
    return Call("GET", "/v1/version", FleetVersions.model_validate)


def node(name: str) -> Call[Node]:
    return Call("GET", f"/v1/nodes/{_node_segment(name)}", Node.model_validate)


def cordon(name: str, reason: str) -> Call[Node]:
    return Call("POST", f"/v1/nodes/{_node_segment(name)}/cordon", Node.model_validate, {"reason": reason})


def uncordon(name: str) -> Call[Node]:
    return Call("POST", f"/v1/nodes/{_node_segment(name)}/uncordon", Node.model_validate)


def drain(
    names: str | Sequence[str], deadline_s: float, grace_s: float, force: bool, reason: str
) -> Call[list[Node]]:
    body = {
        "names": checks.names(names),
        "deadline_s": checks.seconds(deadline_s, "deadline_s"),
        "grace_s": checks.seconds(grace_s, "grace_s"),
        "force": bool(force),
        "reason": reason,
    }
    return Call("POST", "/v1/drain", _list(Node), body)


# -- tenants ---------------------------------------------------------------------------


def tenants() -> Call[list[TenantStatus]]:
    return Call("GET", "/v1/tenants", _list(TenantStatus))


def set_tenant(name: str, policy: dict[str, Any]) -> Call[Tenant]:
    body = Tenant(name=name, **policy).model_dump(mode="json", exclude_unset=True, exclude={"name"})
    return Call("PUT", f"/v1/tenants/{_segment(checks.ident(name, 'tenant'))}", Tenant.model_validate, body)


def delete_tenant(name: str) -> Call[Tenant]:
    return Call("DELETE", f"/v1/tenants/{_segment(checks.ident(name, 'tenant'))}", Tenant.model_validate)


# -- webhooks --------------------------------------------------------------------------


def webhook_secret(tenant: str | None) -> Call[str]:
    return Call("GET", "/v1/webhooks/secret", _secret, query=_tenant(tenant))


def rotate_webhook_secret(tenant: str | None) -> Call[str]:
    return Call("POST", "/v1/webhooks/secret/rotate", _secret, query=_tenant(tenant))


def webhook_deliveries(tenant: str | None, limit: int) -> Call[list[WebhookOutcome]]:
    query = _tenant(tenant) | {"limit": checks.count(limit, "limit", 1, 1000)}
    return Call("GET", "/v1/webhooks/deliveries", _list(WebhookOutcome), query=query)


# -- identities ------------------------------------------------------------------------


def whoami() -> Call[Identity]:
    return Call("GET", "/v1/whoami", Identity.model_validate)


def create_token(
    user: str, tenant: str, role: Role | str, expires_in_s: float | None
) -> Call[tuple[str, TokenInfo]]:
    if str(role) not in {r.value for r in Role}:
        raise SpecError(f"role {role!r}: expected one of {', '.join(r.value for r in Role)}")
    body = {
        "user": checks.ident(user, "user"),
        "tenant": checks.ident(tenant, "tenant"),
        "role": str(role),
        "expires_in_s": checks.seconds(expires_in_s, "expires_in_s"),
    }
    return Call(
        "POST", "/v1/tokens", lambda data: (data["token"], TokenInfo.model_validate(data["info"])), body
    )


def tokens() -> Call[list[TokenInfo]]:
    return Call("GET", "/v1/tokens", _list(TokenInfo))


def revoke_token(token_id: str) -> Call[TokenInfo]:
    return Call(
        "DELETE", f"/v1/tokens/{_segment(checks.ident(token_id, 'token id'))}", TokenInfo.model_validate
    )


# -- answers ---------------------------------------------------------------------------


def job(data: Any) -> Job:
    return Job.model_validate(data, context=_STORED)


def array(data: Any) -> JobArray:
    return JobArray.model_validate(data, context=_STORED)


def spec_body(spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
    """A spec as the API takes it: fields the caller set (so the tenant defaults to the token's)."""
    if isinstance(spec, JobSpec):
        return spec.model_dump(mode="json", exclude_unset=True)
    return spec


def _entries(rows: Any) -> list[Job | JobArray]:
    return [array(r) if r.get("kind") == "array" else job(r) for r in rows]


def _list(model: Any) -> Callable[[Any], list[Any]]:
    return lambda rows: [model.model_validate(row) for row in rows]


def _secret(data: Any) -> str:
    return str(data["secret"])


def _tenant(tenant: str | None) -> dict[str, Any]:
    return {"tenant": None if tenant is None else checks.ident(tenant, "tenant")}


def _job_segment(job_id: str) -> str:
    return _segment(checks.ident(job_id))


def _node_segment(name: str) -> str:
    return _segment(checks.ident(name, "node"))


def _segment(value: str) -> str:
    """An id as one path segment: anything that is not a plain name cannot name a job or node."""
    return quote(str(value), safe="")
