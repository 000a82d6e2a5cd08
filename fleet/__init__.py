"""fleet: a serverless-style job queue for your own GPU fleet.

The names below are imported on first use (PEP 562): ``import fleet`` (and so every ``fleet``
command) pays only for what it touches, not for the whole package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.client import ArrayHandle, Client, JobHandle
    from fleet.errors import FleetError, JobExpired, JobTimeout, NotFound, SpecError
    from fleet.models import CancelReport, Job, JobArray, JobSpec, JobState, Mount, Node, NodeState

__version__ = "0.1.0"
__all__ = [
    "ArrayHandle", "CancelReport", "Client", "FleetError", "Job", "JobArray", "JobExpired", "JobHandle",
    "JobSpec", "JobState", "JobTimeout", "Mount", "Node", "NodeState", "NotFound", "SpecError", "__version__",
]  # fmt: skip

_HOMES = {
    "fleet.client": ("ArrayHandle", "Client", "JobHandle"),
    "fleet.errors": ("FleetError", "JobExpired", "JobTimeout", "NotFound", "SpecError"),
    "fleet.models": ("CancelReport", "Job", "JobArray", "JobSpec", "JobState", "Mount", "Node", "NodeState"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
