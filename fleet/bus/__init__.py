"""The message bus: dramatiq's Redis broker in its own logical DB. Messages are hints; state is truth.

``Bus`` (and with it dramatiq) is imported on first use: a CLI command that sends nothing, or
only builds messages, does not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fleet.bus.messages import (
    CONTROLLER_QUEUE,
    AttemptUpdate,
    JobSubmitted,
    Launch,
    NodeChanged,
    QueueLeft,
    Rebatch,
    ShellOpen,
    Stop,
    node_queue,
)

if TYPE_CHECKING:
    from fleet.bus.broker import Bus

__all__ = [
    "CONTROLLER_QUEUE",
    "AttemptUpdate",
    "Bus",
    "JobSubmitted",
    "Launch",
    "NodeChanged",
    "QueueLeft",
    "Rebatch",
    "ShellOpen",
    "Stop",
    "node_queue",
    "rebatch_attempt",
    "stop_attempt",
]


def stop_attempt(
    bus: Bus, job_id: str, attempt: int, nodes: Iterable[str], reason: str, grace_s: float
) -> None:
    """Stop attempt ``attempt`` of ``job_id`` on every node it holds (every member of a multi-node job
    leaves together): SIGTERM, ``grace_s`` to checkpoint, then SIGKILL."""
    stop = Stop(job_id=job_id, attempt=attempt, reason=reason, grace_s=grace_s)
    for node in nodes:
        bus.send(node_queue(node), stop)


def rebatch_attempt(bus: Bus, job_id: str, attempt: int, nodes: Iterable[str], batch: int) -> None:
    """Tell attempt ``attempt`` of ``job_id``, on every node it holds, its new global ``batch``: it
    follows a batch change while it runs (the record, written first, says so too)."""
    rebatch = Rebatch(job_id=job_id, attempt=attempt, batch_size=batch)
    for node in nodes:
        bus.send(node_queue(node), rebatch)


def __getattr__(name: str) -> Any:
    if name != "Bus":
        raise AttributeError(f"module 'fleet.bus' has no attribute {name!r}")
    from fleet.bus.broker import Bus

    return Bus
