"""fleet: a serverless-style job queue for your own GPU fleet.

The names below are imported on first use (PEP 562): ``import fleet`` (and so every ``fleet``
command) pays only for what it touches, not for the whole package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.client.aio import AsyncArrayHandle, AsyncClient, AsyncJobHandle
    from fleet.client.aio_functions import AsyncFunctionHandle
    from fleet.client.executor import Executor
    from fleet.client.functions import AsyncFunction, Function, FunctionHandle, function
    from fleet.client.handles import (
        ALL_COMPLETED,
        FIRST_COMPLETED,
        ArrayHandle,
        JobHandle,
        as_completed,
        wait,
    )
    from fleet.client.sync import Client
    from fleet.errors import (
        FleetError,
        JobCancelled,
        JobExpired,
        JobFailed,
        JobTimeout,
        NotFound,
        RemoteError,
        SpecError,
    )
    from fleet.models import (
        CancelReport,
        Job,
        JobArray,
        JobSpec,
        JobState,
        Mount,
        Node,
        NodeState,
        Progress,
        Webhook,
    )

__version__ = "0.2.0"

_HOMES = {
    "fleet.client.aio": ("AsyncArrayHandle", "AsyncClient", "AsyncJobHandle"),
    "fleet.client.aio_functions": ("AsyncFunctionHandle",),
    "fleet.client.sync": ("Client",),
    "fleet.client.executor": ("Executor",),
    "fleet.client.functions": ("AsyncFunction", "Function", "FunctionHandle", "function"),
    "fleet.client.handles": (
        "ALL_COMPLETED",
        "FIRST_COMPLETED",
        "ArrayHandle",
        "JobHandle",
        "as_completed",
        "wait",
    ),
    "fleet.errors": (
        "FleetError",
        "JobCancelled",
        "JobExpired",
        "JobFailed",
        "JobTimeout",
        "NotFound",
        "RemoteError",
        "SpecError",
    ),
    "fleet.models": (
        "CancelReport",
        "Job",
        "JobArray",
        "JobSpec",
        "JobState",
        "Mount",
        "Node",
        "NodeState",
        "Progress",
        "Webhook",
    ),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "ArrayHandle",
    "AsyncArrayHandle",
    "AsyncClient",
    "AsyncFunction",
    "AsyncFunctionHandle",
    "AsyncJobHandle",
    "CancelReport",
    "Client",
    "Executor",
    "FleetError",
    "Function",
    "FunctionHandle",
    "Job",
    "JobArray",
    "JobCancelled",
    "JobExpired",
    "JobFailed",
    "JobHandle",
    "JobSpec",
    "JobState",
    "JobTimeout",
    "Mount",
    "Node",
    "NodeState",
    "NotFound",
    "Progress",
    "RemoteError",
    "SpecError",
    "Webhook",
    "__version__",
    "as_completed",
    "function",
    "wait",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
