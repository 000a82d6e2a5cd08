"""One error tree for fleet.

Library errors (redis, docker, NVML) are translated at the boundary with ``raise ... from``.
Whether a failure is worth retrying is part of its type: ``retryable`` is a class attribute.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error fleet raises on purpose."""

    retryable = False
    exit_code = 1


class SpecError(FleetError, ValueError):
    """A job spec (or CLI input) is invalid. The message names the field and the fix."""

    exit_code = 2


class ConfigError(FleetError):
    """The configuration file or environment is invalid."""

    exit_code = 2


class NotFound(FleetError, LookupError):
    """A job or node that does not exist."""

    exit_code = 3


class CorruptRecord(NotFound):
    """A stored job or node record fleet cannot read: skipped by readers, quarantined by the
    controller with this reason. A kind of NotFound: there is no usable job or node by that name."""

    exit_code = 7


class JobTimeout(FleetError, TimeoutError):
    """``wait`` ran out of time before the job reached a final state."""

    exit_code = 4


class DrainTimeout(FleetError, TimeoutError):
    """``wait_drained`` ran out of time before every node was DRAINED."""

    exit_code = 4


class StoreUnavailable(FleetError):
    """Redis could not be reached; callers back off and retry."""

    retryable = True
    exit_code = 5


class NotLeader(FleetError):
    """A controller write was refused: another controller holds the leader lease (fencing token)."""


class MalformedMessage(FleetError):
    """A bus message whose payload does not match its schema: dead-lettered, never retried."""


class GpuError(FleetError):
    """The GPU inventory failed (NVML missing, device lost)."""


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


class RuntimeUnavailable(FleetError):
    """The container runtime (Docker daemon) does not answer."""

    retryable = True
