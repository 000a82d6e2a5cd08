"""Feasibility checks, cheap first; each says why it rejects a node."""

from __future__ import annotations

from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob

GiB = 1 << 30


def node_reason(node: NodeView) -> str | None:
    return None if node.schedulable else node.why or "not schedulable"


def gpu_matches(job: PendingJob, gpu: GpuSlot) -> bool:
    return (
        gpu.healthy
        and (job.gpu_model or "").lower() in gpu.model.lower()
        and (job.min_gpu_memory is None or gpu.memory_total >= job.min_gpu_memory)
    )


def matching(job: PendingJob, node: NodeView) -> list[GpuSlot]:
    """Healthy GPUs of ``node`` that satisfy the job's constraints, free or not."""
    return [g for g in node.gpus if gpu_matches(job, g)]


def constraint_text(job: PendingJob) -> str:
    parts = []
    if job.gpu_model:
        parts.append(f"model ~ {job.gpu_model!r}")
    if job.min_gpu_memory:
        parts.append(f">= {job.min_gpu_memory / GiB:g} GiB")
    if job.cpus:
        parts.append(f"{job.cpus:g} CPUs")
    if job.memory:
        parts.append(f"{job.memory / GiB:g} GiB memory")
    return f" ({', '.join(parts)})" if parts else ""


def capacity_reason(job: PendingJob, node: NodeView, fitting: int) -> str | None:
    """Why ``node`` could never run ``job``, even empty (``fitting``: its healthy matching GPUs)."""
    if fitting < job.gpus:
        return f"has {fitting} matching GPU{'s' if fitting != 1 else ''}"
    if job.cpus and node.cpus and job.cpus > node.cpus:
        return f"has {node.cpus:g} CPUs"
    if job.memory and node.memory and job.memory > node.memory:
        return f"has {node.memory / GiB:.0f} GiB memory"
    return None


def fits_resources(job: PendingJob, node: NodeView, free_cpus: float, free_memory: int) -> bool:
    """CPUs and memory left on ``node`` cover the job (unreported capacity checks nothing)."""
    return (not node.cpus or job.cpus <= free_cpus + 1e-9) and (not node.memory or job.memory <= free_memory)


def free_reason(
    job: PendingJob, node: NodeView, available: int, fitting: int, free_cpus: float, free_memory: int
) -> str:
    """Why ``node`` cannot run ``job`` now (it could when empty): ``available`` of its ``fitting``
    matching GPUs are free."""
    if available < job.gpus:
        return f"{available} of {fitting} matching GPUs free"
    if node.cpus and job.cpus > free_cpus + 1e-9:
        return f"{max(free_cpus, 0):g} of {node.cpus:g} CPUs free"
    return f"{max(free_memory, 0) / GiB:.1f} of {node.memory / GiB:.0f} GiB memory free"
