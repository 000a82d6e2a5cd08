"""The read-only world the scheduler sees, and the plan it returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuSlot:
    uuid: str
    index: int
    model: str
    memory_total: int
    #: placeable now: healthy, unclaimed, not busy with a foreign process
    free: bool = True
    #: why not free ("claimed by j1:2", "busy: foreign pid 4242", "lost")
    why: str = ""
    healthy: bool = True


@dataclass(frozen=True)
class NodeView:
    name: str
    schedulable: bool
    why: str = ""
    gpus: tuple[GpuSlot, ...] = ()


@dataclass(frozen=True)
class PendingJob:
    id: str
    priority: int
    seq: int
    gpus: int
    gpu_model: str | None = None
    min_gpu_memory: int | None = None
    not_before: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    jobs: tuple[PendingJob, ...]
    nodes: tuple[NodeView, ...]


@dataclass(frozen=True)
class Placement:
    job_id: str
    node: str
    gpus: tuple[str, ...]


@dataclass
class Plan:
    placements: list[Placement] = field(default_factory=list)
    #: job id -> why it was not placed this pass
    waiting: dict[str, str] = field(default_factory=dict)
