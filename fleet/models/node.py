"""Nodes and their GPUs, as agents report them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from fleet.models.base import _LAZY


class NodeState(StrEnum):
    READY = "READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    DOWN = "DOWN"


class Gpu(BaseModel):
    """One GPU as the node's inventory reports it."""

    model_config = ConfigDict(frozen=True, defer_build=True)

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

    model_config = _LAZY

    name: str
    state: NodeState
    #: what the operator set (READY, CORDONED, ...); ``state`` shows DOWN over it while the lease is gone
    admin_state: NodeState = NodeState.READY
    alive: bool
    reason: str = ""
    heartbeat_at: float = 0.0
    gpus: list[Gpu] = Field(default_factory=list)
    #: allocatable CPUs and memory the agent offers, and what placed jobs were granted of them
    cpus: float = 0
    memory: int = 0
    used_cpus: float = 0
    used_memory: int = 0
    runtime: str = ""
    gpu_backend: str = ""
    #: where the other members of a multi-node job reach this node
    address: str = ""
    #: the operator's labels for the node (agent.labels: rack, ...)
    labels: dict[str, str] = Field(default_factory=dict)
    claims: dict[str, str] = Field(default_factory=dict)
    #: when the admin state last changed, and by whom ("user@host")
    changed_at: float = 0.0
    changed_by: str = ""
    #: DRAINING: running jobs may finish until this time, then get SIGTERM and ``drain_grace_s``
    drain_deadline: float | None = None
    drain_grace_s: float = 0.0
    #: ids of the jobs placed on the node and not yet released
    jobs: list[str] = Field(default_factory=list)
    #: the release of the agent that last heartbeated ("": one that recorded none, 0.1.0 or older)
    version: str = ""


class FleetVersions(BaseModel):
    """Which release each running service runs (``GET /v1/version``); "" for one that recorded none
    (0.1.0 or older). ``mixed`` says when they differ (:func:`fleet.versions.mixed`)."""

    model_config = _LAZY

    #: the API server that answered
    api: str
    #: the leading controller's; None while no controller leads
    controller: str | None = None
    #: each live node's agent, by node name
    nodes: dict[str, str] = Field(default_factory=dict)
    mixed: str = ""
