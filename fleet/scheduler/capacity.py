"""What is free where, indexed so a placement costs a lookup, not a scan of every node.

Built per pass from the node views (nodes x GPUs, cheap); nodes are bucketed by how many GPUs
matching a constraint class (model substring, minimum memory) they have free, so best fit is the
first bucket with enough GPUs. Placements update the buckets as they go.
"""

from __future__ import annotations

import bisect

from fleet.scheduler.feasible import (
    capacity_reason,
    constraint_text,
    fits_resources,
    free_reason,
    gpu_matches,
    matching,
    node_reason,
)
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob, Placement

ConstraintClass = tuple[str | None, int | None]


class Capacity:
    def __init__(self, nodes: tuple[NodeView, ...] | list[NodeView]) -> None:
        self.nodes = {n.name: n for n in nodes}
        #: free GPUs per schedulable node, lowest index first
        self.free: dict[str, list[GpuSlot]] = {
            n.name: sorted((g for g in n.gpus if g.free), key=lambda g: g.index)
            for n in nodes
            if n.schedulable
        }
        self.cpus = {n.name: n.cpus - n.used_cpus for n in nodes}
        self.memory = {n.name: n.memory - n.used_memory for n in nodes}
        #: nodes kept for a higher-ranked GPU job that could not be placed yet
        self.reserved: set[str] = set()
        self._classes: dict[ConstraintClass, dict[int, list[str]]] = {}

    # -- index ------------------------------------------------------------------------

    def _index(self, job: PendingJob) -> dict[int, list[str]]:
        key = (job.gpu_model, job.min_gpu_memory)
        if key not in self._classes:
            buckets: dict[int, list[str]] = {}
            for name in sorted(self.free):
                count = sum(1 for g in self.free[name] if gpu_matches(job, g))
                buckets.setdefault(count, []).append(name)
            self._classes[key] = buckets
        return self._classes[key]

    def _reindex(self, name: str, before: list[GpuSlot]) -> None:
        """Move ``name`` between buckets of every built class after its free GPUs changed."""
        for (model, min_memory), buckets in self._classes.items():
            probe = PendingJob("", 0, 0, 0, model, min_memory)
            old = sum(1 for g in before if gpu_matches(probe, g))
            new = sum(1 for g in self.free[name] if gpu_matches(probe, g))
            if old != new:
                buckets[old].remove(name)
                bisect.insort(buckets.setdefault(new, []), name)

    # -- placing ----------------------------------------------------------------------

    def place(self, job: PendingJob) -> Placement | None:
        """Best fit: the node with the fewest matching free GPUs that still fit, ties by name."""
        buckets = self._index(job)
        for count in sorted(k for k in buckets if k >= job.gpus):
            for name in buckets[count]:
                if job.gpus and name in self.reserved:
                    continue
                if fits_resources(job, self.nodes[name], self.cpus[name], self.memory[name]):
                    return self._take(job, name)
        return None

    def _take(self, job: PendingJob, name: str) -> Placement:
        before = self.free[name]
        chosen = [g for g in before if gpu_matches(job, g)][: job.gpus]
        self.free[name] = [g for g in before if g not in chosen]
        self.cpus[name] -= job.cpus
        self.memory[name] -= job.memory
        if chosen:
            self._reindex(name, before)
        return Placement(job.id, name, tuple(g.uuid for g in chosen), job.cpus, job.memory)

    # -- explaining -------------------------------------------------------------------

    def explain(self, job: PendingJob) -> tuple[str, list[str]]:
        """Why ``job`` fits nowhere now, and the nodes that could take it once work ends there."""
        reasons: list[tuple[str, str, str]] = []  # (node, detail, category)
        later = []
        for name in sorted(self.nodes):
            node = self.nodes[name]
            why = node_reason(node) or capacity_reason(job, node, matching(job, node))
            if why is not None:
                reasons.append((name, why, why))
                continue
            later.append(name)
            if job.gpus and name in self.reserved:
                reasons.append((name, "reserved for a higher-ranked job", "reserved for a higher-ranked job"))
            else:
                free = sum(1 for g in self.free.get(name, []) if gpu_matches(job, g))
                detail = free_reason(job, node, free, self.cpus[name], self.memory[name])
                reasons.append((name, detail, _busy_category(detail)))
        return _summary(job, reasons), later

    def reserve_for(self, job: PendingJob, later: list[str]) -> None:
        """Keep the node closest to fitting ``job`` from lower-ranked GPU jobs."""
        if job.gpus and later:
            self.reserved.add(max(later, key=lambda n: (self._free_matching(job, n), n)))

    def _free_matching(self, job: PendingJob, name: str) -> int:
        return sum(1 for g in self.free.get(name, []) if gpu_matches(job, g))


def _busy_category(detail: str) -> str:
    """What a busy node lacks, without counts: a large fleet's summary must not change with every
    job that starts or ends, or every waiting job's reason would be rewritten every pass."""
    lacking = "GPUs" if "GPUs free" in detail else "CPUs" if "CPUs free" in detail else "memory"
    return f"busy (not enough free {lacking})"


def _summary(job: PendingJob, reasons: list[tuple[str, str, str]]) -> str:
    need = f"needs {job.gpus} GPU{'s' if job.gpus != 1 else ''}{constraint_text(job)}"
    if not reasons:
        return f"{need}; no nodes registered"
    if len(reasons) <= 3:
        return f"{need}; " + "; ".join(f"{name}: {detail}" for name, detail, _ in reasons)
    # what the nodes lack, without counts: how many nodes are busy changes with every job that
    # starts or ends, and every waiting job of the shape would have its reason rewritten
    categories = sorted({category for _, _, category in reasons})
    return f"{need}; on the {len(reasons)} nodes: " + ", ".join(categories)
