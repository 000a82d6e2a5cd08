"""fleet: a serverless-style job queue for your own GPU fleet."""

from fleet.client import ArrayHandle, Client, JobHandle
from fleet.errors import FleetError, JobExpired, JobTimeout, NotFound, SpecError
from fleet.models import CancelReport, Job, JobArray, JobSpec, JobState, Mount, Node, NodeState

__version__ = "0.1.0"
__all__ = [
    "ArrayHandle", "CancelReport", "Client", "FleetError", "Job", "JobArray", "JobExpired", "JobHandle",
    "JobSpec", "JobState", "JobTimeout", "Mount", "Node", "NodeState", "NotFound", "SpecError", "__version__",
]  # fmt: skip
