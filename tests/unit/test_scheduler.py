"""The pure scheduler: priority then FIFO, best-fit packing, constraints, reasons, no shared GPU."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.scheduler import BACKOFF, GpuSlot, NodeView, PendingJob, Snapshot, schedule
from tests.unit.plans import check_members

GiB = 1 << 30


def node(
    name: str,
    gpus: int,
    busy: set[int] | None = None,
    model: str = "A100",
    memory: int = 80,
    schedulable: bool = True,
    why: str = "",
) -> NodeView:
    busy = busy or set()
    slots = tuple(GpuSlot(f"{name}-g{i}", i, model, memory * GiB, free=i not in busy) for i in range(gpus))
    return NodeView(name, schedulable, why, slots)


def job(jid: str, gpus: int, seq: int, priority: int = 0, **kw: object) -> PendingJob:
    return PendingJob(jid, priority, seq, gpus, **kw)  # type: ignore[arg-type]


def test_priority_first_then_submission_order() -> None:
    snap = Snapshot(
        jobs=(job("old", 1, 1), job("new", 1, 2), job("vip", 1, 3, priority=5)), nodes=(node("n", 2),)
    )
    plan = schedule(snap, now=0)
    assert [p.job_id for p in plan.placements] == ["vip", "old"]
    assert plan.waiting["new"] == "needs 1 GPU; n: 0 of 2 matching GPUs free"


def test_best_fit_packs_onto_the_fullest_node_that_fits() -> None:
    snap = Snapshot(jobs=(job("j", 1, 1),), nodes=(node("empty", 4), node("half", 4, busy={0, 1})))
    assert schedule(snap, 0).placements[0].node == "half"


def test_gpus_are_chosen_by_uuid_lowest_index_first() -> None:
    snap = Snapshot(jobs=(job("j", 2, 1),), nodes=(node("n", 4, busy={0}),))
    assert schedule(snap, 0).placements[0].gpus == ("n-g1", "n-g2")


def test_constraints_on_model_and_memory() -> None:
    nodes = (
        node("a100", 2, model="NVIDIA A100-SXM4-40GB", memory=40),
        node("h100", 2, model="NVIDIA H100 80GB HBM3"),
    )
    snap = Snapshot(
        jobs=(job("h", 1, 1, gpu_model="h100"), job("big", 1, 2, min_gpu_memory=60 * GiB)), nodes=nodes
    )
    assert {p.job_id: p.node for p in schedule(snap, 0).placements} == {"h": "h100", "big": "h100"}
    none = schedule(Snapshot(jobs=(job("x", 1, 1, gpu_model="MI300"),), nodes=nodes), 0)
    assert (
        none.waiting["x"]
        == "fits no registered node: needs 1 GPU (model ~ 'MI300'); a100: has 0 matching GPUs; h100: has 0 "
        "matching GPUs"
    )


def test_unschedulable_nodes_and_backoff_are_explained() -> None:
    snap = Snapshot(
        jobs=(job("j", 1, 1), job("later", 1, 2, not_before=30.0)),
        nodes=(node("c", 2, schedulable=False, why="cordoned: maintenance"),),
    )
    plan = schedule(snap, now=10.0)
    assert plan.placements == []
    # the backoff's deadline is on the job (fleet show renders the countdown): the stored reason never
    # changes while it counts down, so it is written once, not every pass
    assert plan.waiting == {"j": "needs 1 GPU; c: cordoned: maintenance", "later": BACKOFF}


def test_a_blocked_big_job_reserves_a_node_against_smaller_later_jobs() -> None:
    # the 2-GPU job waits for n1 (one GPU busy); the later 1-GPU job must not take n1's free GPU
    snap = Snapshot(
        jobs=(job("big", 2, 1), job("small", 1, 2)), nodes=(node("n1", 2, busy={0}), node("n2", 1, busy={0}))
    )
    plan = schedule(snap, 0)
    assert plan.placements == []
    assert "n1: reserved for a higher-ranked job" in plan.waiting["small"]


def test_cpu_only_jobs_need_no_gpu() -> None:
    plan = schedule(Snapshot(jobs=(job("cpu", 0, 1),), nodes=(node("n", 1, busy={0}),)), 0)
    assert plan.placements[0].gpus == ()


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(st.tuples(st.integers(0, 8), st.sets(st.integers(0, 7))), min_size=0, max_size=5),
    jobs=st.lists(st.tuples(st.integers(0, 9), st.integers(-2, 2)), max_size=25),
)
def test_placements_never_share_a_gpu_and_always_fit(
    nodes: list[tuple[int, set[int]]], jobs: list[tuple[int, int]]
) -> None:
    views = tuple(
        node(f"n{i}", count, busy={b for b in busy if b < count}) for i, (count, busy) in enumerate(nodes)
    )
    pending = tuple(job(f"j{i}", gpus, i, priority) for i, (gpus, priority) in enumerate(jobs))
    plan = schedule(Snapshot(pending, views), 0)
    by_id = {j.id: j for j in pending}
    check_members(plan, by_id, views)
    assert set(plan.waiting) | {p.job_id for p in plan.placements} == set(by_id)
