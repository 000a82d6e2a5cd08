"""Message schemas and queue names. A payload that does not match its schema is dead-lettered."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

CONTROLLER_QUEUE = "fleet.controller"


def node_queue(node: str) -> str:
    """The queue a node's agent consumes (dramatiq queue names allow letters, digits, '.', '_', '-')."""
    return "fleet.node." + re.sub(r"[^A-Za-z0-9_.-]", "_", node)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    #: dramatiq actor name, fixed per message type
    actor: str = ""


class Launch(Message):
    """controller -> agent: start job J attempt A on these GPUs."""

    actor: str = "launch"
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    gpus: list[str]


class Stop(Message):
    """controller/client -> agent: stop job J attempt A (cancel, drain), with a grace period."""

    actor: str = "stop"
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    reason: str
    grace_s: float = Field(default=10.0, ge=0)


class Rebatch(Message):
    """controller -> agent: job J attempt A, which follows a batch change while it runs, now runs at
    global batch B (its agents tell the attempt: ``fleet_worker.batch_size(follow=True)`` reads it)."""

    actor: str = "rebatch"
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    batch_size: int = Field(ge=1)


class JobSubmitted(Message):
    """client -> controller: a job was queued; run a scheduling pass."""

    actor: str = "job_submitted"
    job_id: str = Field(min_length=1)


#: cancelled queued jobs a QueueLeft names at most (past that it asks for a resync)
MAX_NAMED = 100


class QueueLeft(Message):
    """client or agent -> controller: jobs joined the queue (a batch submit, a requeue) or left it
    (cancelled, started, ended); the controller reads each named job again, into its queue in memory
    or out of it (at most ``MAX_NAMED`` named; past that, ``resync``: read the whole queue again).
    Agents name the attempts they started and ended this way (``fleet.bus.hints``)."""

    actor: str = "queue_left"
    job_ids: list[str] = Field(default_factory=list, max_length=MAX_NAMED)
    resync: bool = False


class AttemptUpdate(Message):
    """agent -> controller: an attempt started or exited (the state is already in Redis). Sent by
    agents of 0.1.0; agents now name such jobs in ``JobSubmitted``/``QueueLeft`` hints, and the
    freed GPUs reach the controller through the nodes-changed feed."""

    actor: str = "attempt_update"
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    node: str
    phase: str = Field(pattern="^(started|exited)$")
    exit_code: int | None = None
    oom: bool = False
    reason: str = ""


class NodeChanged(Message):
    """agent/operator -> controller: a node joined, freed GPUs or changed state."""

    actor: str = "node_changed"
    node: str = Field(min_length=1)


class ShellOpen(Message):
    """API -> agent: run ``command`` (none: a shell) in job J attempt A's environment on this node,
    its bytes relayed through the session's streams (``fleet.state.shells``); ``user`` opened it."""

    actor: str = "shell_open"
    session: str = Field(pattern="^[0-9a-f]{32}$")
    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    user: str
    command: list[str] = Field(default_factory=list, max_length=1000)
    tty: bool = False
    term: str = Field(default="", max_length=64)
    rows: int = Field(default=0, ge=0, le=10_000)
    cols: int = Field(default=0, ge=0, le=10_000)
