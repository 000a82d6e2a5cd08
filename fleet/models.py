"""The shapes fleet stores and passes around: job specs, jobs, nodes and GPUs."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from fleet.errors import SpecError

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object) -> int | None:
    """Bytes from an int or a string like ``512m``, ``8g``, ``16GiB`` (binary units, as Docker)."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size: use bytes or a number with k, m, g or t (e.g. 8g)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


Size = Annotated[Annotated[int, Field(ge=1)] | None, BeforeValidator(parse_size)]


class JobState(StrEnum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def on_node(self) -> bool:
        return self in ON_NODE_STATES


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: states in which a job is bound to a node and holds GPU claims
ON_NODE_STATES = (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING)


class Mount(BaseModel):
    """A host directory bind-mounted into the job; allowed only under the operator's allow-list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="absolute host path")
    target: str = Field(description="absolute path in the container")
    read_only: bool = True

    @field_validator("source", "target")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "/../" in f"{value}/":
            raise ValueError("must be an absolute path without '..'")
        return value


class JobSpec(BaseModel):
    """What a user asks to run. Unknown fields are rejected so typos never pass silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, description="1-63 letters, digits, '_', '.', '-'")
    command: list[str] = Field(min_length=1)
    image: str | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    gpus: int = Field(default=0, ge=0, le=64)
    cpus: float | None = Field(default=None, gt=0, le=1024)
    memory: Size = None
    shm_size: Size = None
    gpu_model: str | None = Field(default=None, min_length=1, description="substring of the GPU model name")
    min_gpu_memory: Size = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    max_attempts: int = Field(default=3, ge=1, le=100)
    labels: dict[str, str] = Field(default_factory=dict)
    tenant: str = Field(default="default", pattern=_NAME)
    mounts: list[Mount] = Field(default_factory=list)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the program (first element) must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not a valid variable name (letters, digits, '_')")
            if key.startswith("FLEET_"):
                raise ValueError(f"{key!r}: FLEET_* variables are set by fleet itself")
        return value

    @classmethod
    def parse(cls, data: dict[str, Any]) -> JobSpec:
        """Validate ``data``; raise :class:`SpecError` naming each bad field and what is allowed."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(describe_errors(exc)) from None


def describe_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "spec"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = f"unknown field; allowed fields: {', '.join(sorted(JobSpec.model_fields))}"
        elif err["type"] == "missing":
            message = "is required"
        elif "input" in err and err["type"] not in ("value_error",):
            message = f"{message} (got {err['input']!r})"
        lines.append(f"{field}: {message.removeprefix('Value error, ')}")
    return "invalid job spec:\n  " + "\n  ".join(lines)


class Exit(BaseModel):
    """How one attempt ended, as the agent saw it."""

    model_config = ConfigDict(frozen=True)

    code: int | None = None
    oom: bool = False
    reason: str = ""
    #: who is to blame: "job" spends the retry budget, "infra" does not, "cancel" ends the job.
    fault: str = "job"
    #: what kind of infrastructure event, for metrics: node_down, drain, fenced, gpu_busy, lost
    kind: str = ""


class Job(BaseModel):
    """A job as stored: its spec plus where it stands."""

    id: str
    spec: JobSpec
    state: JobState
    attempt: int = 0
    failures: int = 0
    infra_requeues: int = 0
    node: str | None = None
    gpus: list[str] = Field(default_factory=list)
    reason: str = ""
    exit_code: int | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    not_before: float = 0.0
    cancel_requested: bool = False
    #: why fleet asked the attempt to stop for reasons not the job's (drain, preemption), or ""
    preempt: str = ""
    checkpoint: str | None = None
    seq: int = 0
    #: when the job entered its current state (launch deadlines count from it)
    state_since: float = 0.0


class Event(BaseModel):
    """One entry of a job's history."""

    at: float
    state: str
    attempt: int
    reason: str
    node: str | None = None


class NodeState(StrEnum):
    READY = "READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    DOWN = "DOWN"


class Gpu(BaseModel):
    """One GPU as the node's inventory reports it."""

    model_config = ConfigDict(frozen=True)

    uuid: str
    index: int
    model: str
    memory_total: int
    memory_used: int = 0
    utilization: int = 0
    temperature: int | None = None
    healthy: bool = True
    health: str = "ok"
    processes: list[int] = Field(default_factory=list)
    #: why the GPU is not placeable although healthy ("busy: foreign pid 4242 (python)"), or ""
    busy: str = ""


class Node(BaseModel):
    """A node record: what the agent last published and what operators set."""

    name: str
    state: NodeState
    #: what the operator set (READY, CORDONED, ...); ``state`` shows DOWN over it while the lease is gone
    admin_state: NodeState = NodeState.READY
    alive: bool
    reason: str = ""
    heartbeat_at: float = 0.0
    gpus: list[Gpu] = Field(default_factory=list)
    cpus: int = 0
    memory: int = 0
    runtime: str = ""
    gpu_backend: str = ""
    claims: dict[str, str] = Field(default_factory=dict)
    #: when the admin state last changed, and by whom ("user@host")
    changed_at: float = 0.0
    changed_by: str = ""
    #: DRAINING: running jobs may finish until this time, then get SIGTERM and ``drain_grace_s``
    drain_deadline: float | None = None
    drain_grace_s: float = 0.0
    #: ids of the jobs placed on the node and not yet released
    jobs: list[str] = Field(default_factory=list)
