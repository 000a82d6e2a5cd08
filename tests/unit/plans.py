"""Checks every scheduling property test makes of a plan: what a user would call a wrong placement."""

from __future__ import annotations

from collections import defaultdict

from fleet.scheduler import NodeView, PendingJob, Plan


def check_members(
    plan: Plan, jobs: dict[str, PendingJob], nodes: list[NodeView] | tuple[NodeView, ...]
) -> None:
    """No GPU given twice or given while not free; a gang placed whole (every rank, none twice),
    one member per node, in equal shares adding up to what the job asked; a single-node job whole."""
    free = {g.uuid: n.name for n in nodes for g in n.gpus if g.free}
    used = [g for p in plan.placements for g in p.gpus]
    assert len(used) == len(set(used)), "a GPU given twice"
    members = defaultdict(list)
    for p in plan.placements:
        assert all(free.get(g) == p.node for g in p.gpus), f"{p.job_id} given a GPU not free on {p.node}"
        members[p.job_id].append(p)
    for job_id, placed in members.items():
        job = jobs[job_id]
        assert sorted(p.rank for p in placed) == list(range(placed[0].members)), f"{job_id} placed in part"
        assert len({p.node for p in placed}) == len(placed), f"two members of {job_id} on one node"
        assert len({len(p.gpus) for p in placed}) == 1, f"{job_id}'s members got unequal shares"
        assert sum(len(p.gpus) for p in placed) == job.gpus or (not job.gpus and len(placed) >= 1)
