"""Whether a job could ever run on the nodes registered: one that no node could hold (8 GPUs on one
node of 4, ``--cpus 1000``, ``--gpu-model H100`` with none registered) is refused at submit, naming
the field and the largest the fleet has, instead of queueing in silence (as sbatch's "Requested node
configuration is not available").

Every registered node counts, whatever its state: a cordoned, draining or down node is still the
fleet's shape and comes back; its GPUs count healthy or not (a GPU's health can return). A job larger
than every node is split as the scheduler splits it (``Capacity.split``) and refused only when fewer
nodes than its members could hold one. With no node registered (a fleet still coming up) every job is
accepted, and ``allow_unplaceable`` accepts a job for a node not registered yet.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from fleet.controller.snapshot import DEFAULT_CPUS
from fleet.errors import SpecError
from fleet.models import JobSpec, Node
from fleet.scheduler import Capacity, GpuSlot, NodeView, PendingJob
from fleet.scheduler.feasible import GiB, capacity_reason, constraint_text, matching

ESCAPE = "or submit with --allow-unplaceable (allow_unplaceable: true) for a node not registered yet"


#: how long a submit trusts the node shapes it read: shapes change when a node joins or loses a GPU
SHAPES_TTL_S = 5.0


class Shapes:
    """The registered nodes' shapes, read at most every :data:`SHAPES_TTL_S` for accepting a job and
    read afresh before refusing one (a node that joined a moment ago is never missed) and while none
    is registered (a fleet coming up accepts everything), so a stream of submits costs one read of
    the nodes every few seconds, not one each."""

    def __init__(self, nodes: Callable[[], list[Node]], clock: Callable[[], float] = time.monotonic) -> None:
        self._nodes, self._clock = nodes, clock
        self._views: list[NodeView] = []
        self._read_at: float | None = None

    def views(self, fresh: bool = False) -> list[NodeView]:
        now = self._clock()
        stale = self._read_at is None or now - self._read_at >= SHAPES_TTL_S
        if fresh or stale or not self._views:  # none registered yet: the first may join any moment
            self._views, self._read_at = [_shape(n) for n in self._nodes()], now
        return self._views

    def check(self, spec: JobSpec) -> None:
        """:class:`SpecError` naming what no registered node could ever give ``spec``."""
        if spec.allow_unplaceable or unplaceable(spec, self.views()) is None:
            return
        if why := unplaceable(spec, self.views(fresh=True)):
            raise SpecError(f"invalid job spec:\n  {why}; {ESCAPE}")


def unplaceable(spec: JobSpec, views: list[NodeView]) -> str | None:
    """Why no node of these shapes (see :func:`shape`) could ever hold ``spec`` (``field: ...``), or
    None when some could (or none is registered)."""
    if not views:
        return None
    cpus = spec.cpus if spec.cpus is not None else (DEFAULT_CPUS if spec.max_gpus == 0 else 0.0)
    job = PendingJob(
        id="",
        priority=0,
        seq=0,
        gpus=spec.min_gpus,
        gpu_model=spec.gpu_model,
        min_gpu_memory=spec.min_gpu_memory,
        cpus=cpus,
        memory=spec.memory or 0,
        nodes=spec.nodes or 0,
        gpus_per_node=spec.gpus_per_node or 0,
    )
    capacity = Capacity(views)
    members, per_node = capacity.split(job)
    member = capacity.member(job, per_node)
    could = [v.name for v in views if capacity_reason(member, v, len(matching(member, v))) is None]
    if len(could) >= members:
        return None
    return _why(member, members, views, could)


def _shape(node: Node) -> NodeView:
    """What ``node`` could ever hold: all its GPUs, CPUs and memory, nothing granted."""
    gpus = tuple(GpuSlot(g.uuid, g.index, g.model, g.memory_total) for g in node.gpus)
    return NodeView(node.name, True, gpus=gpus, cpus=node.cpus, memory=node.memory)


def _why(member: PendingJob, members: int, views: list[NodeView], could: list[str]) -> str:
    constrained = member.gpus and (member.gpu_model or member.min_gpu_memory)
    if constrained and not any(matching(member, v) for v in views):
        models = sorted({g.model for v in views for g in v.gpus})
        field = "gpu_model" if member.gpu_model else "min_gpu_memory"
        return (
            f"{field}: no registered node has a GPU{constraint_text(_gpu_only(member))} "
            f"(models registered: {', '.join(models) or 'none'})"
        )
    largest = max(len(matching(member, v)) for v in views)
    if member.gpus > largest:
        holders = _names(v.name for v in views if len(matching(member, v)) == largest)
        return (
            f"gpus: {member.gpus} on one node, but the largest node has {largest} (nodes: {holders}); "
            f"ask for at most {largest} per node (a larger job runs as a gang, one member per node: "
            "--nodes, --gpus-per-node)"
        )
    cpus = [v for v in views if v.cpus]
    if member.cpus and len(cpus) == len(views) and member.cpus > (most := max(v.cpus for v in cpus)):
        holders = _names(v.name for v in cpus if v.cpus == most)
        return f"cpus: {member.cpus:g} on one node, but the largest node has {most:g} (nodes: {holders})"
    mem = [v for v in views if v.memory]
    if member.memory and len(mem) == len(views) and member.memory > (top := max(v.memory for v in mem)):
        holders = _names(v.name for v in mem if v.memory == top)
        return (
            f"memory: {member.memory / GiB:g} GiB on one node, but the largest node has "
            f"{top / GiB:.0f} GiB (nodes: {holders})"
        )
    each = f"{member.gpus} GPU{'s' if member.gpus != 1 else ''}{constraint_text(member)}"
    if members > 1:
        return (
            f"gpus: {members * member.gpus} GPUs run as {members} members of {each} (one node each), "
            f"but only {len(could)} registered node{'s' if len(could) != 1 else ''} could hold one"
            f"{f' ({_names(could)})' if could else ''}; ask for fewer GPUs or pin --gpus-per-node"
        )
    lacking = "; ".join(
        f"{v.name}: {capacity_reason(member, v, len(matching(member, v)))}" for v in views[:3]
    )
    return f"spec: no registered node has {each} together ({lacking})"


def _gpu_only(member: PendingJob) -> PendingJob:
    return dataclasses.replace(member, cpus=0.0, memory=0)


def _names(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
