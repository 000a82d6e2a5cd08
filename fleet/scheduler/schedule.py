"""``schedule(snapshot, now) -> Plan``: priority first, then submission order; best-fit packing.

A GPU job that fits some node when empty but not now *reserves* the node with the most matching
free GPUs: lower-ranked GPU jobs are not placed there, so a large job is not starved by a stream
of small ones (they still use every other node). A job no node could ever fit stays QUEUED with
the reason, because a node that fits may join later.
"""

from __future__ import annotations

from collections import Counter

from fleet.scheduler.feasible import capacity_reason, constraint_text, free_reason, matching, node_reason
from fleet.scheduler.snapshot import NodeView, PendingJob, Placement, Plan, Snapshot


def schedule(snapshot: Snapshot, now: float) -> Plan:
    plan = Plan()
    free = {n.name: {g.uuid for g in n.gpus if g.free} for n in snapshot.nodes}
    reserved: set[str] = set()
    for job in sorted(snapshot.jobs, key=lambda j: (-j.priority, j.seq)):
        if job.not_before > now:
            plan.waiting[job.id] = f"backing off for {job.not_before - now:.0f}s more"
            continue
        placement, reasons, later = _place(job, snapshot.nodes, free, reserved)
        if placement:
            plan.placements.append(placement)
            free[placement.node] -= set(placement.gpus)
            continue
        if later and job.gpus:
            reserved.add(max(later, key=lambda n: (len(free[n]), n)))
        plan.waiting[job.id] = _explain(job, reasons)
    return plan


def _place(
    job: PendingJob, nodes: tuple[NodeView, ...], free: dict[str, set[str]], reserved: set[str]
) -> tuple[Placement | None, list[str], list[str]]:
    """Best fit for ``job``; else the reasons per node and the nodes that could fit it later."""
    fits: list[tuple[int, str, list[str]]] = []
    reasons: list[str] = []
    later: list[str] = []
    for node in nodes:
        why = node_reason(node)
        fitting = matching(job, node) if why is None else []
        why = why or capacity_reason(job, node, fitting)
        if why is None and job.gpus and node.name in reserved:
            why = "reserved for a higher-ranked job"
            later.append(node.name)
        elif why is None:
            why = free_reason(job, fitting, free[node.name])
            if why is not None:
                later.append(node.name)
        if why is not None:
            reasons.append(f"{node.name}: {why}")
            continue
        chosen = sorted((g for g in fitting if g.uuid in free[node.name]), key=lambda g: g.index)[: job.gpus]
        fits.append((len(free[node.name]) - job.gpus, node.name, [g.uuid for g in chosen]))
    if not fits:
        return None, reasons, later
    _, name, gpus = min(fits)
    return Placement(job.id, name, tuple(gpus)), reasons, later


def _explain(job: PendingJob, reasons: list[str]) -> str:
    need = f"needs {job.gpus} GPU{'s' if job.gpus != 1 else ''}{constraint_text(job)}"
    if not reasons:
        return f"{need}; no nodes registered"
    by_reason = Counter(r.split(": ", 1)[1] for r in reasons)
    if len(reasons) > 3:
        summary = "; ".join(
            f"{count} node{'s' if count > 1 else ''} {why}" for why, count in by_reason.items()
        )
    else:
        summary = "; ".join(reasons)
    return f"{need}; {summary}"
