"""Build the scheduler's read-only snapshot from stored jobs and nodes (the only I/O-facing part)."""

from __future__ import annotations

from fleet.models import Job, Node, NodeState
from fleet.scheduler import GpuSlot, NodeView, PendingJob, Snapshot


def pending(job: Job) -> PendingJob:
    spec = job.spec
    return PendingJob(
        id=job.id, priority=spec.priority, seq=job.seq, gpus=spec.gpus, gpu_model=spec.gpu_model,
        min_gpu_memory=spec.min_gpu_memory, not_before=job.not_before,
    )  # fmt: skip


def node_view(node: Node, now: float) -> NodeView:
    if not node.alive:
        why = f"down (no heartbeat for {now - node.heartbeat_at:.0f}s)" if node.heartbeat_at else "down"
    elif node.state != NodeState.READY:
        state = node.state.value.lower()
        why = state + (f": {node.reason}" if node.reason and node.reason != state else "")
    else:
        why = ""
    gpus = tuple(
        GpuSlot(
            uuid=g.uuid, index=g.index, model=g.model, memory_total=g.memory_total, healthy=g.healthy,
            free=g.healthy and not g.busy and g.uuid not in node.claims,
            why=(g.health if not g.healthy else g.busy or (f"claimed by {node.claims[g.uuid]}"
                                                            if g.uuid in node.claims else "")),
        )
        for g in node.gpus
    )  # fmt: skip
    return NodeView(name=node.name, schedulable=not why, why=why, gpus=gpus)


def build(jobs: list[Job], nodes: list[Node], now: float) -> Snapshot:
    return Snapshot(jobs=tuple(pending(j) for j in jobs), nodes=tuple(node_view(n, now) for n in nodes))
