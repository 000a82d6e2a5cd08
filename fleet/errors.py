"""One error tree for fleet.

Library errors (redis, docker, NVML) are translated at the boundary with ``raise ... from``.
Whether a failure is worth retrying is part of its type: ``retryable`` is a class attribute.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class FleetError(Exception):
    """Base of every error fleet raises on purpose."""

    retryable = False
    exit_code = 1


class SpecError(FleetError, ValueError):
    """A job spec (or CLI input) is invalid. The message names the field and the fix."""

    exit_code = 2


class IdInUse(SpecError):
    """The id asked for cannot name a new job: a job array has it, or a job that expired held it."""


class ConfigError(FleetError):
    """The configuration file or environment is invalid."""

    exit_code = 2


class NotFound(FleetError, LookupError):
    """A job or node that does not exist."""

    exit_code = 3


class JobExpired(NotFound):
    """A job that ended and was deleted by retention (``job_retention_s`` after it ended): its
    tombstone, kept for ``tombstone_retention_s``, says how it ended and when it was deleted."""

    def __init__(self, job_id: str, state: str = "", ended_at: float = 0.0, expired_at: float = 0.0) -> None:
        when = f" it ended {state} at {_utc(ended_at)} and" if state else ""
        deleted = f" at {_utc(expired_at)}" if expired_at else ""
        super().__init__(
            f"job {job_id!r} expired:{when} its record, history and logs were deleted{deleted} "
            "(job_retention_s)"
        )
        self.job_id, self.state, self.ended_at, self.expired_at = job_id, state, ended_at, expired_at


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


class CorruptRecord(NotFound):
    """A stored job or node record fleet cannot read: skipped by readers, quarantined by the
    controller with this reason. A kind of NotFound: there is no usable job or node by that name."""

    exit_code = 7


class JobTimeout(FleetError, TimeoutError):
    """``wait`` ran out of time before the job reached a final state."""

    exit_code = 4


class JobFailed(FleetError):
    """``JobHandle.result()`` of a job that ended FAILED; ``job`` is its final status."""

    exit_code = 1

    def __init__(self, job: object, message: str) -> None:
        super().__init__(message)
        self.job = job


class JobCancelled(JobFailed):
    """``JobHandle.result()`` of a job that was CANCELLED."""

    exit_code = 6


class RemoteError(FleetError):
    """A function job's own exception that cannot be rebuilt here (it could not be pickled on the
    node, or its class cannot be imported here): its type's name, message and traceback, in words."""

    exit_code = 1

    def __init__(self, kind: str, message: str, traceback: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.traceback = kind, message, traceback


class DrainTimeout(FleetError, TimeoutError):
    """``wait_drained`` ran out of time before every node was DRAINED."""

    exit_code = 4


class StoreUnavailable(FleetError):
    """Redis could not be reached; callers back off and retry."""

    retryable = True
    exit_code = 5


class NotReplicated(StoreUnavailable):
    """A write reached the Redis primary but not ``redis_replicas_ack`` replicas in time: it is not
    acknowledged (a failover now could lose it). Retry the call; a submit with its own job id is
    created once however often it is retried."""


class ApiUnavailable(StoreUnavailable):
    """The fleet API could not be reached, or it could not reach Redis."""


class TooManyRequests(FleetError):
    """A token holds as many blocking calls (waits, followed logs) as the API allows one token."""

    retryable = True
    exit_code = 5


class Unauthorized(FleetError):
    """No token, or one the API does not know (revoked, expired, mistyped)."""

    exit_code = 8


class Forbidden(FleetError):
    """The token is valid but its role or tenant does not allow the call; the message says what is missing."""

    exit_code = 8


class NotLeader(FleetError):
    """A controller write was refused: another controller holds the leader lease (fencing token)."""


class MalformedMessage(FleetError):
    """A bus message whose payload does not match its schema: dead-lettered, never retried."""


class GpuError(FleetError):
    """The GPU inventory failed (NVML missing, device lost); ``code`` is NVML's error code, if any."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class LaunchError(FleetError):
    """A job attempt could not be started. ``retryable`` says whose fault it was."""

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


class ImageNotFound(LaunchError):
    """The job's image is not on the node (and could not be pulled)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, retryable=False)


class GpuBusy(LaunchError):
    """An assigned GPU turned out not to be free: the node refuses, the job goes back to the queue."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, retryable=True)


class LeaseUnconfirmed(LaunchError):
    """The node supervisor refused an attempt because the node's own lease confirmation lapsed (its
    agent's heartbeats were late): neither the job's fault nor the node's hardware's. The attempt
    goes back to the queue and does not count toward the node's quarantine."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, retryable=True)


class RuntimeUnavailable(FleetError):
    """The container runtime (Docker daemon) does not answer."""

    retryable = True


def error_body(exc: FleetError) -> dict[str, Any]:
    """An error as the API answers it: what a client needs to raise the same error (its type,
    message and exit code)."""
    body: dict[str, Any] = {"error": type(exc).__name__, "detail": str(exc), "exit_code": exc.exit_code}
    if isinstance(exc, JobExpired):
        body["expired"] = {
            "job_id": exc.job_id,
            "state": exc.state,
            "ended_at": exc.ended_at,
            "expired_at": exc.expired_at,
        }
    return body


def at_index(index: int, check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``, its refusal naming the item of a batch it is about: ``jobs[3]: gpus: ...``
    (the same error type, the same exit code)."""
    try:
        return check(*args)
    except FleetError as exc:
        try:
            named = type(exc)(f"jobs[{index}]: {exc}")
        except TypeError:  # an error that carries more than a message
            named = SpecError(f"jobs[{index}]: {exc}")
        raise named from None
