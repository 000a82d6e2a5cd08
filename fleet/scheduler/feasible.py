"""Feasibility checks, cheap first; each says why it rejects a node."""

from __future__ import annotations

from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob

GiB = 1 << 30


def node_reason(node: NodeView) -> str | None:
    return None if node.schedulable else node.why or "not schedulable"


def matching(job: PendingJob, node: NodeView) -> list[GpuSlot]:
    """Healthy GPUs of ``node`` that satisfy the job's constraints, free or not."""
    model = (job.gpu_model or "").lower()
    return [
        g
        for g in node.gpus
        if g.healthy
        and model in g.model.lower()
        and (job.min_gpu_memory is None or g.memory_total >= job.min_gpu_memory)
    ]


def constraint_text(job: PendingJob) -> str:
    parts = []
    if job.gpu_model:
        parts.append(f"model ~ {job.gpu_model!r}")
    if job.min_gpu_memory:
        parts.append(f">= {job.min_gpu_memory / GiB:g} GiB")
    return f" ({', '.join(parts)})" if parts else ""


def capacity_reason(job: PendingJob, node: NodeView, fitting: list[GpuSlot]) -> str | None:
    """Why ``node`` could never run ``job``, even empty."""
    if len(fitting) >= job.gpus:
        return None
    return f"has {len(fitting)} matching GPU{'s' if len(fitting) != 1 else ''}"


def free_reason(job: PendingJob, fitting: list[GpuSlot], free: set[str]) -> str | None:
    """Why ``node`` cannot run ``job`` now."""
    available = sum(1 for g in fitting if g.uuid in free)
    if available >= job.gpus:
        return None
    return f"{available} of {len(fitting)} matching GPUs free"
