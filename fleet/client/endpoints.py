"""Every call of the fleet API, declared once: its method, path, request body or query (arguments
checked before anything is sent) and how its answer is read. :class:`fleet.Client` sends these one
by one, :class:`fleet.AsyncClient` awaits the same ones; a new endpoint is one function here (or in
:mod:`fleet.client.fleet_endpoints`: nodes, tenants, access) and a one-line method on each client.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from fleet.client import checks
from fleet.client.calls import Call, array, entries, job, job_segment, listed, segment
from fleet.errors import SpecError
from fleet.models import (
    CancelReport,
    Event,
    Job,
    JobArray,
    JobState,
    LogLine,
    QueuePosition,
    RequeueReport,
    TasksChanged,
    check_job_id,
    relative_path,
)
from fleet.models.usage import GROUPINGS, History, parse_when

#: most jobs one :meth:`fleet.Client.submit_many` call queues (the API's ``MAX_BATCH``)
MAX_BATCH = 1000


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
    return Call("GET", f"/v1/jobs/{job_segment(job_id)}", job)


def get_array(array_id: str) -> Call[JobArray]:
    return Call("GET", f"/v1/arrays/{segment(checks.ident(array_id, 'array id'))}", array)


def listing(query: dict[str, Any]) -> Call[list[Job | JobArray]]:
    """Jobs and arrays (one entry each); ``query`` from :func:`filters`."""
    return Call("GET", "/v1/jobs", entries, query=query)


def jobs(query: dict[str, Any]) -> Call[list[Job]]:
    """Every job, array tasks one by one; ``query`` from :func:`filters`."""
    return Call("GET", "/v1/jobs", lambda rows: [job(r) for r in rows], query=query | {"flat": "true"})


def quarantined(what: str) -> Call[dict[str, str]]:
    """``what``: "jobs" or "nodes"."""
    return Call("GET", "/v1/quarantine", lambda data: dict(data[what]))


def position(job_id: str) -> Call[QueuePosition | None]:
    return Call(
        "GET",
        f"/v1/jobs/{job_segment(job_id)}/position",
        lambda data: None if data is None else QueuePosition.model_validate(data),
    )


def history(job_id: str) -> Call[list[Event]]:
    return Call("GET", f"/v1/jobs/{job_segment(job_id)}/history", listed(Event))


def cancel(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_segment(job_id)}/cancel", job)


def send_stdin(job_id: str, data: bytes, eof: bool) -> Call[int]:
    """Bytes for a job's stdin (``spec.stdin``); ``eof`` ends it after them."""
    path = f"/v1/jobs/{job_segment(job_id)}/stdin"
    return Call("POST", path, lambda got: int(got["sent"]), data, {"eof": "true"} if eof else None)


def resize(job_id: str, gpus: int, batch_size: int | None) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{segment(job_id)}/resize", job, {"gpus": gpus, "batch_size": batch_size})


def cancel_array(array_id: str) -> Call[CancelReport]:
    path = f"/v1/arrays/{segment(checks.ident(array_id, 'array id'))}/cancel"
    return Call("POST", path, CancelReport.model_validate)


def cancel_labels(labels: dict[str, str]) -> Call[CancelReport]:
    if not checks.labels(labels):
        raise SpecError("cancel by label: give at least one label KEY=VALUE")
    return Call("POST", "/v1/cancel", CancelReport.model_validate, {"labels": labels})


def hold(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_segment(job_id)}/hold", job)


def release(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_segment(job_id)}/release", job)


def array_tasks(array_id: str, act: str) -> Call[TasksChanged]:
    """Hold (``act`` "hold") or release every queued task of a job array."""
    path = f"/v1/arrays/{segment(checks.ident(array_id, 'array id'))}/{act}"
    return Call("POST", path, TasksChanged.model_validate)


def update(job_id: str, priority: int | None, gpus: int | None, timeout: float | str | None) -> Call[Job]:
    if priority is None and gpus is None and timeout is None:
        raise SpecError("update: give at least one of priority, gpus, timeout")
    body = {"priority": priority, "gpus": gpus, "timeout": timeout}
    return Call("POST", f"/v1/jobs/{job_segment(job_id)}/update", job, body)


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
    path = f"/v1/arrays/{segment(checks.ident(array_id, 'array id'))}/requeue"
    return Call("POST", path, RequeueReport.model_validate, {"states": states})


def wait_once(job_id: str, left: float, timeout: float) -> Call[Job]:
    """The job once final, or as it stands after ``left`` seconds (at most 30: call again)."""
    return Call(
        "GET",
        f"/v1/jobs/{job_segment(job_id)}/wait",
        job,
        query={"timeout_s": f"{left:.3f}"},
        timeout=left + timeout,
    )


def logs(job_id: str, attempt: int | None, rank: int) -> Call[list[LogLine]]:
    query = {"attempt": checks.attempt(attempt), "rank": checks.count(rank, "rank", 0, 64)}
    return Call("GET", f"/v1/jobs/{job_segment(job_id)}/logs", listed(LogLine), query=query)


def follow(job_id: str, attempt: int | None, rank: int) -> tuple[str, dict[str, Any]]:
    """Path and query of a followed log (a stream of JSON lines), arguments checked."""
    query = {"attempt": checks.attempt(attempt), "rank": checks.count(rank, "rank", 0, 64), "follow": "true"}
    return f"/v1/jobs/{job_segment(job_id)}/logs", query


def download(job_id: str, path: str | None, checkpoint: str | None) -> tuple[str, dict[str, Any]]:
    """Path and query of a job's kept outputs (under ``path``) or of one of its checkpoints (a
    gzipped tar), arguments checked before anything is sent."""
    segment = job_segment(job_id)
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
