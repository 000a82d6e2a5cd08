"""Feasibility checks, cheap first; each says why it rejects a node.

``short_of`` is fleet's one rule for whether a job's CPUs and memory fit a node: the scheduler
decides with it and explains with it, and place_many.lua does not check it again (only the
leader grants CPUs and memory, so what it read is never short; see docs/ARCHITECTURE.md).
"""

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


def short_of(job: PendingJob, node: NodeView, free_cpus: float, free_memory: int) -> str | None:
    """What ``node`` lacks for ``job`` with ``free_cpus`` and ``free_memory`` (bytes) left on it:
    "CPUs", "memory", or None when both fit. A node that reports no CPUs or memory (0) is not
    checked for it. CPUs are compared with a tolerance: grants are sums of fractions."""
    if node.cpus and job.cpus > free_cpus + 1e-9:
        return "CPUs"
    if node.memory and job.memory > free_memory:
        return "memory"
    return None


def capacity_reason(job: PendingJob, node: NodeView, fitting: int) -> str | None:
    """Why ``node`` could never run ``job``, even empty (``fitting``: its healthy matching GPUs)."""
    if fitting < job.gpus:
        return f"has {fitting} matching GPU{'s' if fitting != 1 else ''}"
    short = short_of(job, node, node.cpus, node.memory)
    if short == "CPUs":
        return f"has {node.cpus:g} CPUs"
    if short == "memory":
        return f"has {node.memory / GiB:.0f} GiB memory"
    return None


def fits_resources(job: PendingJob, node: NodeView, free_cpus: float, free_memory: int) -> bool:
    """CPUs and memory left on ``node`` cover the job (see :func:`short_of`)."""
    return short_of(job, node, free_cpus, free_memory) is None


def free_reason(
    job: PendingJob, node: NodeView, available: int, fitting: int, free_cpus: float, free_memory: int
) -> str:
    """Why ``node`` cannot run ``job`` now (it could when empty): ``available`` of its ``fitting``
    matching GPUs are free."""
    if available < job.gpus:
        return f"{available} of {fitting} matching GPUs free"
    if short_of(job, node, free_cpus, free_memory) == "CPUs":
        return f"{max(free_cpus, 0):g} of {node.cpus:g} CPUs free"
    return f"{max(free_memory, 0) / GiB:.1f} of {node.memory / GiB:.0f} GiB memory free"
