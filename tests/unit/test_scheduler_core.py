"""The incremental scheduler core: CPUs and memory are scheduled, and the queue kept across passes
places exactly what a from-scratch pass over the same state places (property-tested)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.scheduler import Capacity, GpuSlot, NodeView, PendingJob, PendingQueue, Plan, Snapshot, schedule
from tests.unit.plans import check_members

GiB = 1 << 30


def node(
    name: str,
    gpus: int,
    cpus: float = 0,
    memory: int = 0,
    busy: frozenset[int] = frozenset(),
    used_cpus: float = 0,
    model: str = "A100",
) -> NodeView:
    slots = tuple(GpuSlot(f"{name}-g{i}", i, model, 80 * GiB, free=i not in busy) for i in range(gpus))
    return NodeView(name, True, "", slots, cpus=cpus, memory=memory, used_cpus=used_cpus)


def test_cpu_only_jobs_spread_by_cpus_instead_of_landing_on_one_node() -> None:
    # Given 1,000 CPU-only jobs asking for 1 CPU each and 4 nodes with 8 CPUs each
    jobs = tuple(PendingJob(f"j{i}", 0, i, 0, cpus=1.0) for i in range(1000))
    nodes = tuple(node(f"n{i}", 0, cpus=8) for i in range(4))
    plan = schedule(Snapshot(jobs, nodes), 0)
    # Then 32 run, 8 per node, oldest first, and the rest wait saying why
    per_node: dict[str, int] = {}
    for p in plan.placements:
        per_node[p.node] = per_node.get(p.node, 0) + 1
    assert per_node == {"n0": 8, "n1": 8, "n2": 8, "n3": 8}
    assert [p.job_id for p in plan.placements] == [f"j{i}" for i in range(32)]
    assert plan.waiting["j32"] == "needs 0 GPUs (1 CPUs); on the 4 nodes: busy (not enough free CPUs)"


def test_memory_is_scheduled_and_a_node_too_small_is_named() -> None:
    nodes = (
        NodeView("small", True, "", (), cpus=4, memory=8 * GiB),
        NodeView("big", True, "", (), cpus=4, memory=64 * GiB),
    )
    jobs = (
        PendingJob("fat", 0, 1, 0, cpus=1, memory=32 * GiB),
        PendingJob("huge", 0, 2, 0, cpus=1, memory=128 * GiB),
    )
    plan = schedule(Snapshot(jobs, nodes), 0)
    assert [(p.job_id, p.node) for p in plan.placements] == [("fat", "big")]
    assert "small: has 8 GiB memory" in plan.waiting["huge"]


def test_a_waiting_reason_is_given_once_not_every_pass() -> None:
    queue = PendingQueue([PendingJob("a", 0, 1, 4), PendingJob("b", 0, 2, 4)])
    first = queue.schedule(Capacity([node("n", 2)]), 0)
    second = queue.schedule(Capacity([node("n", 2)]), 1)
    assert set(first.waiting) == {"a", "b"} and second.waiting == {}
    queue.add(PendingJob("c", 0, 3, 4))  # a new job of the same shape gets the shape's reason
    assert set(queue.schedule(Capacity([node("n", 2)]), 2).waiting) == {"c"}


# -- properties --------------------------------------------------------------------------

shapes = st.tuples(st.integers(0, 4), st.sampled_from([0.0, 1.0, 2.0]), st.integers(-1, 1))
node_specs = st.tuples(st.integers(0, 4), st.sampled_from([0.0, 2.0, 4.0]), st.frozensets(st.integers(0, 3)))


def build_nodes(specs: list[tuple[int, float, frozenset[int]]]) -> list[NodeView]:
    return [node(f"n{i}", g, cpus=c, busy=b) for i, (g, c, b) in enumerate(specs)]


def check_plan(plan: Plan, jobs: dict[str, PendingJob], nodes: list[NodeView]) -> None:
    check_members(plan, jobs, nodes)
    cpus: dict[str, float] = {}
    for p in plan.placements:  # each member is granted the job's CPUs on its node
        cpus[p.node] = cpus.get(p.node, 0) + jobs[p.job_id].cpus
    for n in nodes:
        assert not n.cpus or cpus.get(n.name, 0) <= n.cpus + 1e-9, "over a node's CPUs"


def check_rank(plan: Plan, jobs: dict[str, PendingJob], nodes: list[NodeView]) -> None:
    """A waiting job did not fit at its turn: in what was free at the end plus what lower-ranked
    jobs took (a pass only takes capacity, so that is what its turn saw); a waiting gang found fewer
    nodes that fit a member than it has members. GPU jobs may also have been kept off nodes
    reserved for higher-ranked blocked jobs: as many nodes as each blocked shape has members."""
    capacity = Capacity(nodes)
    waiting = [j for j in jobs.values() if j.id in plan.waiting and not j.not_before]
    blocked = {j.shape: capacity.split(j)[0] for j in waiting if j.gpus}
    for job in waiting:
        members, per_node = capacity.split(job)
        member = capacity.member(job, per_node)
        fits_on = [n.name for n in nodes if _fit_at_turn(member, n, plan, jobs)]
        allowed = sum(blocked.values()) if job.gpus else 0
        assert len(fits_on) < members + allowed, f"{job.id} waits though it fit on {fits_on}"


def _fit_at_turn(job: PendingJob, n: NodeView, plan: Plan, jobs: dict[str, PendingJob]) -> bool:
    """``job`` (one member) fit on ``n`` with what lower-ranked jobs took there put back."""
    here = [p for p in plan.placements if p.node == n.name]
    kept = [p for p in here if jobs[p.job_id].rank < job.rank]  # placed before its turn
    taken = {g for p in kept for g in p.gpus}
    gpus = sum(1 for g in n.gpus if g.free and g.uuid not in taken)
    cpus = n.cpus - n.used_cpus - sum(p.cpus for p in kept)
    return gpus >= job.gpus and (not n.cpus or job.cpus <= cpus + 1e-9)


@settings(max_examples=300, deadline=None)
@given(st.lists(node_specs, max_size=5), st.lists(shapes, max_size=30))
def test_a_pass_never_shares_a_gpu_never_overcommits_and_keeps_rank(
    specs: list[tuple[int, float, frozenset[int]]], job_specs: list[tuple[int, float, int]]
) -> None:
    nodes = build_nodes(specs)
    jobs = {f"j{i}": PendingJob(f"j{i}", p, i, g, cpus=c) for i, (g, c, p) in enumerate(job_specs)}
    plan = schedule(Snapshot(tuple(jobs.values()), tuple(nodes)), 0)
    check_plan(plan, jobs, nodes)
    check_rank(plan, jobs, nodes)
    assert set(plan.waiting) | {p.job_id for p in plan.placements} == set(jobs)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), shapes, st.sampled_from([0.0, 5.0])),
        st.tuples(st.just("cancel"), st.tuples(st.integers(0, 40), st.just(0.0), st.just(0)), st.just(0.0)),
        st.tuples(st.just("pass"), st.just((0, 0.0, 0)), st.sampled_from([0.0, 10.0])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(node_specs, min_size=1, max_size=4), ops)
def test_the_queue_kept_across_passes_places_what_a_from_scratch_pass_places(
    specs: list[tuple[int, float, frozenset[int]]], steps: list[tuple[str, tuple[int, float, int], float]]
) -> None:
    # Given a queue changed by submits (some in backoff), cancels and passes, in any order
    nodes = build_nodes(specs)
    queue, pending, seq, clock = PendingQueue(), {}, 0, 0.0
    for op, (gpus, cpus, priority), t in steps:
        clock = max(clock, t)  # time only moves forward
        if op == "add":
            job = PendingJob(f"j{seq}", priority, seq, gpus, not_before=t, cpus=cpus)
            queue.add(job)
            pending[job.id] = job
            seq += 1
        elif op == "cancel":  # gpus holds the index of the job to cancel
            queue.discard(f"j{gpus}")
            pending.pop(f"j{gpus}", None)
        else:
            # When a pass runs on the kept queue and a fresh one is built from the same jobs
            fresh = schedule(Snapshot(tuple(pending.values()), tuple(nodes)), clock)
            kept = queue.schedule(Capacity(nodes), clock)
            # Then both place the same jobs on the same GPUs, and the kept queue forgets them
            assert kept.placements == fresh.placements
            for p in kept.placements:
                pending.pop(p.job_id, None)  # a gang has a placement per member
            assert set(queue.jobs) == set(pending)


def test_an_array_at_its_max_running_waits_without_holding_up_other_jobs() -> None:
    # Given an array whose max_running leaves room for 2 more tasks, and a later plain job
    tasks = [PendingJob(f"a-{i}", 0, i, 1, array="a") for i in range(5)]
    plain = PendingJob("plain", 0, 10, 1)
    plan = schedule(Snapshot((*tasks, plain), (node("n", 8),)), 0, room={"a": 2})
    # Then 2 tasks start, the plain job behind them too, and the rest of the array says why it waits
    assert [p.job_id for p in plan.placements] == ["a-0", "a-1", "plain"]
    assert plan.waiting["a-2"] == "array a has its max_running tasks on nodes"
