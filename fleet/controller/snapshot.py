"""The scheduler's view of stored jobs and nodes (the only I/O-facing part of scheduling)."""

from __future__ import annotations

import time

from fleet.models import Job, Node, NodeState
from fleet.scheduler import GpuSlot, NodeView, PendingJob, Placement
from fleet.scheduler.snapshot import UNSIZED, held_reason, taken

#: CPUs granted to a CPU-only job that names none (as Slurm grants one per task); GPU jobs get none
DEFAULT_CPUS = 1.0


def pending(job: Job, waiting: str = "") -> PendingJob:
    """The scheduler's view of a queued job; ``waiting``: why its dependencies hold it back."""
    spec = job.spec
    cpus = spec.cpus if spec.cpus is not None else (DEFAULT_CPUS if spec.max_gpus == 0 else 0.0)
    gpus = job.gpu_count
    return PendingJob(
        id=job.id,
        priority=spec.priority,
        seq=job.seq,
        gpus=gpus,
        gpu_model=spec.gpu_model,
        min_gpu_memory=spec.min_gpu_memory,
        not_before=job.not_before,
        cpus=cpus,
        memory=spec.memory or 0,
        array=job.array_id if job.array_max_running else None,
        nodes=spec.nodes or 0,
        gpus_per_node=spec.gpus_per_node or 0,
        tenant=spec.tenant,
        elastic=spec.elastic,
        hold=held_reason(job.held_by)
        if job.held_by
        else waiting or (UNSIZED if spec.elastic and not gpus else ""),
        held_by=job.held_by,
        dependent=bool(waiting),
        rev=job.rev,
    )


def node_view(node: Node, now: float, topology: str = "") -> NodeView:
    if not node.alive:  # a time, not an age: the reason must not change while nothing does
        why = f"down (no heartbeat since {_clock(node.heartbeat_at)})" if node.heartbeat_at else "down"
    elif node.state != NodeState.READY:
        state = node.state.value.lower()
        why = state + (f": {node.reason}" if node.reason and node.reason != state else "")
    else:
        why = ""
    gpus = tuple(
        GpuSlot(
            uuid=g.uuid,
            index=g.index,
            model=g.model,
            memory_total=g.memory_total,
            healthy=g.healthy,
            free=g.healthy and not g.busy and g.uuid not in node.claims,
            why=(
                g.health
                if not g.healthy
                else g.busy or (f"claimed by {node.claims[g.uuid]}" if g.uuid in node.claims else "")
            ),
            holder=node.claims.get(g.uuid, ""),
        )
        for g in node.gpus
    )
    return NodeView(
        name=node.name,
        schedulable=not why,
        why=why,
        gpus=gpus,
        cpus=node.cpus,
        memory=node.memory,
        used_cpus=node.used_cpus,
        used_memory=node.used_memory,
        group=node.labels.get(topology, "") if topology else "",
    )


def claimed(view: NodeView, members: list[Placement], claim: str) -> NodeView:
    """``view`` with what a placement just took, written as ``node_view`` reads it back (``claim``:
    the job's ``job:attempt``): the leader's picture of the node until it reads it again."""
    here = [p for p in members if p.node == view.name]
    return taken(view, here, lambda _: claim, "claimed by {}")


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
