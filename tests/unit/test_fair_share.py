"""Fair share between tenants: guarantees first, the rest by weight over decaying use, limits held,
GPUs kept busy; and over a long run of short jobs, GPU-time converges to the weights."""

from __future__ import annotations

import heapq
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.models import Tenant
from fleet.scheduler import (
    Capacity,
    FairShare,
    NodeView,
    PendingJob,
    PendingQueue,
    Snapshot,
    Use,
    fair_gpus,
    schedule,
)
from fleet.scheduler.usage import accrue, window
from tests.unit.plans import check_members
from tests.unit.test_scheduler import node

HOUR = 3600.0


def jobs(tenant: str, count: int, first_seq: int, gpus: int = 1, priority: int = 0) -> list[PendingJob]:
    return [PendingJob(f"{tenant}{i}", priority, first_seq + i, gpus, tenant=tenant) for i in range(count)]


def fair(
    *tenants: Tenant,
    held: dict[str, int] | None = None,
    usage: dict[str, float] | None = None,
    gpus: int = 8,
    half_life: float = HOUR,
) -> FairShare:
    holdings = {t: Use(gpus=g, jobs=g) for t, g in (held or {}).items()}
    return FairShare({t.name: t for t in tenants}, holdings, usage, Use(gpus=gpus), half_life)


def placed_by_tenant(plan_jobs: list[str], pending: list[PendingJob]) -> Counter[str]:
    tenant = {j.id: j.tenant for j in pending}
    return Counter(tenant[j] for j in plan_jobs)


def test_a_tenant_below_its_guarantee_is_served_before_older_and_higher_priority_work() -> None:
    # Given tenant a's 8 jobs, older and of higher priority, and tenant b guaranteed 3 GPUs
    pending = [*jobs("a", 8, 0, priority=5), *jobs("b", 8, 100)]
    f = fair(Tenant(name="a"), Tenant(name="b", guaranteed_gpus=3), gpus=4)
    # When a pass places on 4 GPUs
    plan = schedule(Snapshot(tuple(pending), (node("n", 4),)), 0, fair=f)
    # Then b gets its 3 guaranteed GPUs first, and a the one left
    order = [p.job_id for p in plan.placements]
    assert order[:3] == ["b0", "b1", "b2"] and placed_by_tenant(order, pending) == {"b": 3, "a": 1}


def test_the_rest_is_shared_by_weight_and_priority_orders_jobs_within_a_tenant() -> None:
    # Given tenants a (weight 1) and b (weight 3) with more work than 8 GPUs, b's later jobs urgent
    pending = [*jobs("a", 10, 0), *jobs("b", 5, 100), *jobs("b", 5, 200, priority=9)]
    pending[-5:] = [PendingJob(f"b-urgent{i}", 9, 200 + i, 1, tenant="b") for i in range(5)]
    plan = schedule(Snapshot(tuple(pending), (node("n", 8),)), 0, fair=fair(Tenant(name="b", weight=3)))
    # Then b holds three times what a holds, and b's urgent jobs went first, oldest first
    placed = [p.job_id for p in plan.placements]
    assert placed_by_tenant(placed, pending) == {"a": 2, "b": 6}
    assert [j for j in placed if j.startswith("b")] == [*(f"b-urgent{i}" for i in range(5)), "b0"]
    assert [j for j in placed if j.startswith("a")] == ["a0", "a1"]


def test_a_tenant_never_exceeds_its_max_and_its_jobs_say_why() -> None:
    # Given tenant a limited to 3 GPUs, already holding 1, and tenant b with only 2 jobs
    pending = [*jobs("a", 6, 0), *jobs("b", 2, 100)]
    f = fair(Tenant(name="a", max_gpus=3), held={"a": 1})
    plan = schedule(Snapshot(tuple(pending), (node("n", 8),)), 0, fair=f)
    # Then a gets 2 more GPUs and no more, although GPUs stay free, and its other jobs say why
    assert placed_by_tenant([p.job_id for p in plan.placements], pending) == {"a": 2, "b": 2}
    assert plan.waiting["a5"] == "tenant a is at its limit of 3 GPUs"
    assert plan.blocked == []  # a limit is not a lack of room: nobody is preempted for it


def test_a_tenants_cpu_and_memory_limits_hold_as_its_gpu_limit_does() -> None:
    # Given tenant a limited to 10 CPUs and 8 GiB, and its CPU-only jobs of 4 CPUs and 2 GiB each
    cpu_jobs = [PendingJob(f"a{i}", 0, i, 0, cpus=4.0, memory=2 << 30, tenant="a") for i in range(5)]
    mem_jobs = [PendingJob(f"m{i}", 0, 10 + i, 0, cpus=1.0, memory=3 << 30, tenant="m") for i in range(5)]
    f = fair(Tenant(name="a", max_cpus=10), Tenant(name="m", max_memory="8g"))
    big = NodeView("n", True, "", (), cpus=64, memory=512 << 30)
    plan = schedule(Snapshot((*cpu_jobs, *mem_jobs), (big,)), 0, fair=f)
    # Then a runs two (8 CPUs, a third would make 12), m two (6 GiB; a third would make 9)
    assert placed_by_tenant([p.job_id for p in plan.placements], [*cpu_jobs, *mem_jobs]) == {"a": 2, "m": 2}
    assert plan.waiting["a4"] == "tenant a is at its limit of 10 CPUs"
    assert plan.waiting["m4"] == "tenant m is at its limit of 8 GiB of memory"


def test_a_tenant_below_its_cpu_or_memory_guarantee_is_served_first() -> None:
    # Given tenant a's older CPU-only jobs, enough to fill the node's CPUs, and tenant c guaranteed
    # 12 CPUs, m guaranteed 6 GiB, each with later jobs of 4 CPUs and 2 GiB
    older = [PendingJob(f"a{i}", 5, i, 0, cpus=4.0, memory=2 << 30, tenant="a") for i in range(8)]
    cpu = [PendingJob(f"c{i}", 0, 100 + i, 0, cpus=4.0, memory=2 << 30, tenant="c") for i in range(8)]
    mem = [PendingJob(f"m{i}", 0, 200 + i, 0, cpus=4.0, memory=2 << 30, tenant="m") for i in range(8)]
    f = FairShare(
        {"c": Tenant(name="c", guaranteed_cpus=12), "m": Tenant(name="m", guaranteed_memory="6g")},
        fleet=Use(cpus=32, memory=64 << 30),
    )
    node_ = NodeView("n", True, "", (), cpus=32, memory=64 << 30)
    # When a pass places on a node of 32 CPUs (8 such jobs)
    plan = schedule(Snapshot((*older, *cpu, *mem), (node_,)), 0, fair=f)
    order = [p.job_id for p in plan.placements]
    # Then c and m reach their guarantees (3 jobs each) before a's older, higher-priority jobs start
    assert set(order[:6]) == {"c0", "c1", "c2", "m0", "m1", "m2"}
    # And the rest goes by dominant share above the guarantees: m's 12 CPUs are far above its memory
    # guarantee, c's are exactly its guarantee, a holds nothing: a, then c, take the last two
    assert order[6:] == ["a0", "c3"]


def test_past_use_decays_and_the_tenant_that_waited_catches_up() -> None:
    # Given tenant a that held the whole fleet for the last half-life, b that used nothing
    used = accrue({}, {"a": 8}, HOUR, HOUR)["a"]
    pending = [*jobs("a", 8, 0), *jobs("b", 8, 100)]
    plan = schedule(Snapshot(tuple(pending), (node("n", 8),)), 0, fair=fair(usage={"a": used}))
    # Then b, equal in weight, gets most of the 8 GPUs now
    assert placed_by_tenant([p.job_id for p in plan.placements], pending)["b"] >= 6
    # And after a few more half-lives without use, a's past weighs (almost) nothing
    decayed = accrue({"a": used}, {}, 6 * HOUR, HOUR)["a"]
    assert decayed < used / 50
    plan = schedule(Snapshot(tuple(pending), (node("n", 8),)), 0, fair=fair(usage={"a": decayed}))
    assert placed_by_tenant([p.job_id for p in plan.placements], pending) == {"a": 4, "b": 4}


def test_a_tenant_over_its_share_still_fills_gpus_nobody_else_can_use() -> None:
    # Given b (weight 3, holding nothing) whose only job needs 4 GPUs on one node, and a that holds a lot
    nodes = (node("n0", 4, busy={0, 1}), node("n1", 2))
    pending = [*jobs("a", 4, 0), PendingJob("big", 0, 100, 4, tenant="b")]
    f = fair(Tenant(name="b", weight=3), held={"a": 6}, gpus=6)
    plan = schedule(Snapshot(tuple(pending), nodes), 0, fair=f)
    # Then a's jobs take the GPUs b cannot use (backfill), but not those of n0, kept for b's big job
    assert sorted((p.job_id, p.node) for p in plan.placements) == [("a0", "n1"), ("a1", "n1")]
    assert plan.blocked == ["big", "a2", "a3"] and "reserved for a higher-ranked job" in plan.waiting["a2"]


def test_fair_shares_in_gpus_give_guarantees_then_split_the_rest_by_weight() -> None:
    policies = {
        "a": Tenant(name="a", guaranteed_gpus=4),
        "b": Tenant(name="b"),
        "c": Tenant(name="c", weight=2, max_gpus=3),
    }
    # a is guaranteed 4, the other 6 split 1:1:2 by weight; c can use only 3, its extra goes to a and b
    shares = fair_gpus(10, {"a": 100, "b": 100, "c": 100}, policies.__getitem__)
    assert shares == pytest.approx({"a": 5.5, "b": 1.5, "c": 3.0})
    # a tenant wanting less than its share leaves the rest to the others
    assert fair_gpus(10, {"a": 1, "b": 100}, policies.__getitem__) == pytest.approx({"a": 1.0, "b": 9.0})


def test_usage_is_gpu_seconds_halving_every_half_life() -> None:
    once = accrue({}, {"a": 2}, 10.0, HOUR)
    assert once["a"] == pytest.approx(20.0, rel=0.01)  # a short step is about GPUs x seconds
    assert accrue(once, {}, HOUR, HOUR)["a"] == pytest.approx(once["a"] / 2)
    forever = accrue({}, {"a": 1}, 100 * HOUR, HOUR)["a"]
    assert forever == pytest.approx(window(HOUR))  # the most one GPU held forever can weigh


# -- properties --------------------------------------------------------------------------

tenant_specs = st.lists(
    st.tuples(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 8)), st.sampled_from([0.5, 1.0, 3.0])),
    min_size=1,
    max_size=3,
)


def policies(specs: list[tuple[int, int | None, float]]) -> dict[str, Tenant]:
    return {
        f"t{i}": Tenant(name=f"t{i}", guaranteed_gpus=min(g, m) if m is not None else g, max_gpus=m, weight=w)
        for i, (g, m, w) in enumerate(specs)
    }


@settings(max_examples=200, deadline=None)
@given(
    tenant_specs,
    st.lists(st.tuples(st.integers(0, 8), st.frozensets(st.integers(0, 7))), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(-1, 1)), max_size=25),
    st.lists(st.integers(0, 3), min_size=3, max_size=3),
)
def test_a_pass_never_puts_a_tenant_over_its_max_nor_shares_a_gpu(
    specs: list[tuple[int, int | None, float]],
    node_specs: list[tuple[int, frozenset[int]]],
    job_specs: list[tuple[int, int, int]],
    held: list[int],
) -> None:
    tenants = policies(specs)
    views = tuple(node(f"n{i}", c, busy={b for b in busy if b < c}) for i, (c, busy) in enumerate(node_specs))
    pending = {
        f"j{i}": PendingJob(f"j{i}", p, i, g, tenant=f"t{t % len(tenants)}")
        for i, (t, g, p) in enumerate(job_specs)
    }
    holding = {
        name: min(h, tenants[name].max_gpus or 0) if tenants[name].max_gpus is not None else h
        for name, h in zip(tenants, held, strict=False)
    }
    f = FairShare(tenants, {t: Use(gpus=g) for t, g in holding.items()}, {}, Use(gpus=8))
    plan = schedule(Snapshot(tuple(pending.values()), views), 0, fair=f)
    check_members(plan, pending, views)
    gained = Counter[str]()
    for job_id in {p.job_id for p in plan.placements}:
        gained[pending[job_id].tenant] += pending[job_id].gpus
    for name, tenant in tenants.items():
        assert tenant.max_gpus is None or holding.get(name, 0) + gained[name] <= tenant.max_gpus
    assert set(plan.waiting) | {p.job_id for p in plan.placements} == set(pending)


@settings(max_examples=200, deadline=None)
@given(
    tenant_specs, st.integers(1, 4), st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 1)), max_size=30)
)
def test_every_tenant_gets_its_guarantee_when_the_fleet_can_hold_them_all(
    specs: list[tuple[int, int | None, float]], node_count: int, job_specs: list[tuple[int, int]]
) -> None:
    # Given 1-GPU jobs of tenants whose guarantees the fleet's free GPUs can hold together
    tenants = policies(specs)
    views = tuple(node(f"n{i}", 4) for i in range(node_count))
    if sum(t.guaranteed_gpus for t in tenants.values()) > 4 * node_count:
        return
    pending = [
        PendingJob(f"j{i}", p, i, 1, tenant=f"t{t % len(tenants)}") for i, (t, p) in enumerate(job_specs)
    ]
    # When a pass runs, whatever the order of submission and the priorities
    plan = schedule(
        Snapshot(tuple(pending), views), 0, fair=FairShare(tenants, fleet=Use(gpus=4 * node_count))
    )
    # Then each tenant holds its guarantee, or all its jobs run
    placed = placed_by_tenant([p.job_id for p in plan.placements], pending)
    asked = Counter(j.tenant for j in pending)
    for name, tenant in tenants.items():
        assert placed[name] >= min(tenant.guaranteed_gpus, asked[name])


# -- a long run ----------------------------------------------------------------------------


def test_gpu_time_shares_converge_to_the_weights_over_a_long_run_of_short_jobs() -> None:
    # Given tenants a (weight 1) and b (weight 3) that always have short 1-GPU jobs queued, 16 GPUs,
    # and usage decaying with a half-life of 2 hours, in virtual time
    rng = random.Random(7)
    tenants = {"a": Tenant(name="a"), "b": Tenant(name="b", weight=3)}
    queue, nodes = PendingQueue(), [node(f"n{i}", 4) for i in range(4)]
    running: list[tuple[float, str, str, str]] = []  # (ends at, job, tenant, gpu)
    usage: dict[str, float] = {}
    gpu_seconds: Counter[str] = Counter()
    seq, now, step, half_life = 0, 0.0, 60.0, 2 * HOUR
    while now < 48 * HOUR:
        for tenant in tenants:  # keep ten jobs of each queued
            while queue.counts[tenant] < 10:
                queue.add(PendingJob(f"{tenant}{seq}", 0, seq, 1, tenant=tenant))
                seq += 1
        busy = {gpu for _, _, _, gpu in running}
        views = [
            node(n.name, 4, busy={int(g.uuid.rsplit("g", 1)[1]) for g in n.gpus if g.uuid in busy})
            for n in nodes
        ]
        held = Counter(t for _, _, t, _ in running)
        fair = FairShare(tenants, {t: Use(gpus=g) for t, g in held.items()}, usage, Use(gpus=16), half_life)
        # When passes place jobs as others end
        for p in queue.schedule(Capacity(views), now, fair=fair).placements:
            heapq.heappush(running, (now + rng.uniform(60, 1200), p.job_id, p.job_id[0], p.gpus[0]))
        now += step
        while running and running[0][0] <= now:
            heapq.heappop(running)
        for _, _, tenant, _ in running:
            gpu_seconds[tenant] += step
        usage = accrue(usage, Counter(t for _, _, t, _ in running), step, half_life)
    # Then b got three quarters of the GPU time and a one quarter, within 10%
    total = sum(gpu_seconds.values())
    assert gpu_seconds["b"] / total == pytest.approx(0.75, rel=0.1)
    assert gpu_seconds["a"] / total == pytest.approx(0.25, rel=0.1)
