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


class Failover(BaseModel):
    """A Redis failover a service saw: when it first reached the new primary, which one, the one
    before, and how long it could open no connection (``redis_failover`` in its log)."""

    model_config = _LAZY

    at: float
    primary: str
    previous: str
    cut_off_s: float
    #: the sentinels' configuration epoch that named the new primary: one per failover, so services
    #: that saw the same one record it once
    epoch: int = 0


class ReplicaLag(BaseModel):
    """One replica as the primary sees it (``INFO replication``)."""

    address: str
    #: ``online`` once in sync; ``wait_bgsave``, ``send_bulk`` while it gets its first copy
    state: str
    #: the replication stream the primary wrote that the replica has not acknowledged
    lag_bytes: int
    #: seconds since the replica last acknowledged (it does every second)
    lag_s: int


class RedisStatus(BaseModel):
    """Which Redis is primary, its replicas and their lag, the sentinels that agree, and the
    failovers the fleet's services saw (``GET /v1/redis``, ``fleet nodes``, the status page)."""

    model_config = _LAZY

    #: ``host:port`` of the primary ("" when it could not be read: ``error`` says why)
    primary: str = ""
    replicas: list[ReplicaLag] = Field(default_factory=list)
    #: the sentinels configured (``redis_sentinels``), and how many of them name ``primary``
    sentinels: int = 0
    sentinels_agreeing: int = 0
    #: failovers the services recorded (the last 100), and the latest
    failovers: int = 0
    last_failover: Failover | None = None
    #: when this was read (it is read at most every few seconds)
    read_at: float = 0.0
    error: str = ""
