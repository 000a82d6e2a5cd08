"""The message bus: dramatiq's Redis broker in its own logical DB. Messages are hints; state is truth."""

from fleet.bus.broker import Bus
from fleet.bus.messages import (
    CONTROLLER_QUEUE,
    AttemptUpdate,
    JobSubmitted,
    Launch,
    NodeChanged,
    Stop,
    node_queue,
)

__all__ = [
    "CONTROLLER_QUEUE",
    "AttemptUpdate",
    "Bus",
    "JobSubmitted",
    "Launch",
    "NodeChanged",
    "Stop",
    "node_queue",
]
