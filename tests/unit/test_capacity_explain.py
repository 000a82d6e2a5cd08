"""A large fleet's waiting reason and reservations come from the free-GPU buckets, not a visit of
every node (the simulator's and the controller's hot path): property-tested against the plain
per-node rule they replace."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.scheduler import Capacity, GpuSlot, NodeView, PendingJob
from fleet.scheduler.capacity import _busy_category, _summary
from fleet.scheduler.feasible import capacity_reason, free_reason, node_reason

GiB = 1 << 30

nodes_st = st.lists(
    st.tuples(
        st.integers(0, 8),  # GPUs
        st.integers(0, 8),  # of which busy
        st.sampled_from([0.0, 4.0, 16.0]),  # CPUs (0: not reported)
        st.sampled_from([0.0, 2.0, 12.0]),  # CPUs used
        st.booleans(),  # schedulable
        st.sampled_from(["A100", "H100"]),
    ),
    min_size=4,
    max_size=9,
)
job_st = st.tuples(st.integers(0, 8), st.sampled_from([None, "H100"]), st.sampled_from([0.0, 1.0, 8.0]))


def _nodes(spec: list[tuple[int, int, float, float, bool, str]]) -> list[NodeView]:
    out = []
    for i, (gpus, busy, cpus, used, ok, model) in enumerate(spec):
        slots = tuple(GpuSlot(f"n{i}-g{g}", g, model, 80 * GiB, free=g >= busy) for g in range(gpus))
        out.append(
            NodeView(f"n{i}", ok, "" if ok else "cordoned", slots, cpus=cpus, used_cpus=min(used, cpus))
        )
    return out


def _reference(cap: Capacity, job: PendingJob) -> tuple[str, list[str]]:
    """The per-node rule: every node's reason, its category, the summary of the categories."""
    reasons, later = [], []
    for name in sorted(cap.nodes):
        node = cap.nodes[name]
        total = sum(1 for g in node.gpus if g.healthy and (job.gpu_model or "") in g.model)
        why = node_reason(node) or capacity_reason(job, node, total)
        if why is not None:
            reasons.append((name, why, why))
            continue
        later.append(name)
        if job.gpus and name in cap.reserved:
            reasons.append((name, "reserved for a higher-ranked job", "reserved for a higher-ranked job"))
            continue
        free = sum(1 for g in cap.free[name] if (job.gpu_model or "") in g.model)
        detail = free_reason(job, node, free, total, cap.cpus[name], cap.memory[name])
        reasons.append((name, detail, _busy_category(detail)))
    return _summary(job, reasons), later


@settings(max_examples=300, deadline=None)
@given(nodes_st, job_st, st.sets(st.integers(0, 8), max_size=4), st.integers(1, 3))
def test_the_bucket_summary_and_reservations_match_the_per_node_rule(
    spec: list[tuple[int, int, float, float, bool, str]],
    ask: tuple[int, str | None, float],
    reserved: set[int],
    members: int,
) -> None:
    cap = Capacity(_nodes(spec))
    cap.reserved = {f"n{i}" for i in reserved if i < len(spec)}
    job = PendingJob("j", 0, 1, ask[0], gpu_model=ask[1], cpus=ask[2])
    assert cap._explain(job) == _reference(cap, job)
    # reservations: the nodes with the most free matching GPUs, ties by the larger name
    gang = PendingJob("g", 0, 2, ask[0] * members, gpu_model=ask[1], nodes=members)
    _, later = cap.explain(gang)
    member = cap.member(gang, ask[0])
    free = {n: sum(1 for g in cap.free.get(n, []) if (ask[1] or "") in g.model) for n in cap.nodes}
    expected = set(cap.reserved)
    if gang.gpus and len(later) >= members:
        expected |= set(heapq.nlargest(members, later, key=lambda n: (free[n], n)))
    cap.reserve_for(gang, later)
    assert member.gpus == ask[0] and cap.reserved == expected
