"""The read-only world the scheduler sees, and the plan it returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

#: what a job asks, the unit the queue is grouped by: (GPUs, GPU model substring, minimum GPU
#: memory, CPUs, memory bytes, the array whose max_running limits it or None, nodes pinned, GPUs per
#: node pinned, its tenant: each tenant's jobs queue apart, so a pass can take turns between them; why
#: it is held back, '' for none: held jobs wait apart from the others)
Shape = tuple[int, str | None, int | None, float, int, str | None, int, int, str, str]
#: where in a Shape its array and its tenant are
ARRAY: Final = 5
TENANT: Final = 8


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
    #: the "job:attempt" whose claim holds it, or "" (what a preemption would free)
    holder: str = ""


@dataclass(frozen=True)
class NodeView:
    name: str
    schedulable: bool
    why: str = ""
    gpus: tuple[GpuSlot, ...] = ()
    #: allocatable CPUs and memory (bytes); 0 = not reported, nothing is checked against it
    cpus: float = 0.0
    memory: int = 0
    #: CPUs and memory already granted to jobs placed on the node
    used_cpus: float = 0.0
    used_memory: int = 0
    #: the node's value of the topology label (its rack): a gang prefers nodes of one group
    group: str = ""


#: why an elastic job that fleet has not sized yet waits (the elastic step sizes it, then it is placed)
UNSIZED = "waiting for the elastic step to choose its size"


def held_reason(user: str) -> str:
    """A held job's waiting reason (what ``fleet jobs`` and ``fleet show`` say)."""
    return f"held by {user}"


@dataclass(frozen=True)
class PendingJob:
    id: str
    priority: int
    seq: int
    gpus: int
    gpu_model: str | None = None
    min_gpu_memory: int | None = None
    not_before: float = 0.0
    #: CPUs and memory the job is granted on its node (scheduled resources, not only limits)
    cpus: float = 0.0
    memory: int = 0
    #: a task of an array with ``max_running``: that array's id (its tasks queue apart, so a full
    #: array waits as one shape without holding up anyone else's)
    array: str | None = None
    #: a multi-node job (a gang, one member per node): the members and GPUs per member the user
    #: pinned, 0 where the scheduler chooses (``gpus`` is the job's total; ``cpus`` and ``memory``
    #: are per member). See ``Capacity.split`` for the rule.
    nodes: int = 0
    gpus_per_node: int = 0
    tenant: str = "default"
    #: an elastic job (sized by the elastic step, which knows its range); ``gpus`` is its current size
    elastic: bool = False
    #: why it may not be placed now ('' when it may): an elastic job not sized yet waits for the elastic
    #: step; a job a user holds (``held_by``) waits until released
    hold: str = ""
    #: who holds it back (``fleet hold``), '' for nobody: the pass neither places, sizes nor
    #: preempts for it
    held_by: str = ""
    #: it waits for other jobs to end (``JobSpec.after``; ``hold`` names the one): as a held job, it
    #: asks for no GPUs meanwhile, so its tenant's fair share does not grow for it
    dependent: bool = False
    #: the job's revision when read: a placement of an older one is refused (the job changed since)
    rev: int = 0

    @property
    def shape(self) -> Shape:
        return (
            self.gpus,
            self.gpu_model,
            self.min_gpu_memory,
            self.cpus,
            self.memory,
            self.array,
            self.nodes,
            self.gpus_per_node,
            self.tenant,
            self.hold,
        )

    @property
    def rank(self) -> tuple[int, int]:
        """Lower ranks first: priority, then submission order."""
        return (-self.priority, self.seq)


@dataclass(frozen=True)
class Snapshot:
    jobs: tuple[PendingJob, ...]
    nodes: tuple[NodeView, ...]


@dataclass(frozen=True)
class Placement:
    """Where one member of a job goes: a single-node job has one, a gang one per node (rank 0
    first), and a gang is placed whole or not at all."""

    job_id: str
    node: str
    gpus: tuple[str, ...]
    cpus: float = 0.0
    memory: int = 0
    rank: int = 0
    members: int = 1


@dataclass
class Plan:
    placements: list[Placement] = field(default_factory=list)
    #: the jobs placed, by id
    jobs: dict[str, PendingJob] = field(default_factory=dict)
    #: job id -> why it was not placed this pass (only jobs whose reason changed, in a core's pass)
    waiting: dict[str, str] = field(default_factory=dict)
    #: the best jobs of each shape that found no room this pass (not those held back by a limit or a
    #: backoff), in the order the pass tried them: what a preemption could be for
    blocked: list[str] = field(default_factory=list)


def taken(
    view: NodeView, here: Sequence[Placement], holder: Callable[[Placement], str], why: str = ""
) -> NodeView:
    """``view`` with what ``here`` (placements on this node) took: their GPUs, each held by
    ``holder(placement)`` (and, with ``why``, its reason: ``why`` formatted with the holder), their
    CPUs and memory."""
    if not here:
        return view
    held = {u: holder(p) for p in here for u in p.gpus}
    gpus = tuple(
        replace(g, free=False, holder=held[g.uuid], why=why.format(held[g.uuid]) if why else g.why)
        if g.uuid in held
        else g
        for g in view.gpus
    )
    return replace(
        view,
        gpus=gpus,
        used_cpus=view.used_cpus + sum(p.cpus for p in here),
        used_memory=view.used_memory + sum(p.memory for p in here),
    )
