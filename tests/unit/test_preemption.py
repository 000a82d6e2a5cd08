"""Preemption decisions: whom to stop so that a waiting job starts, and when to stop nobody."""

from __future__ import annotations

from fleet.models import Tenant
from fleet.scheduler import (
    Capacity,
    FairShare,
    GpuSlot,
    NodeView,
    PendingJob,
    PendingQueue,
    Preemption,
    RunningJob,
    Use,
    preemptions,
)

NOW = 10_000.0


def nodes(*specs: tuple[str, int, dict[int, str]]) -> list[NodeView]:
    """(name, GPUs, {index: holding job id})."""
    out = []
    for name, count, held in specs:
        gpus = tuple(
            GpuSlot(
                f"{name}-g{i}",
                i,
                "A100",
                80 << 30,
                free=i not in held,
                holder=f"{held[i]}:1" if i in held else "",
            )
            for i in range(count)
        )
        out.append(NodeView(name, True, "", gpus))
    return out


def running(
    job_id: str,
    tenant: str,
    where: list[tuple[str, list[int]]],
    priority: int = 0,
    ran_s: float = 3600.0,
    preemptible: bool = True,
) -> RunningJob:
    members = tuple((node, tuple(f"{node}-g{i}" for i in idx)) for node, idx in where)
    gpus = sum(len(idx) for _, idx in where)
    return RunningJob(
        job_id, 1, tenant, priority, gpus, members, started_at=NOW - ran_s, preemptible=preemptible
    )


def decide(
    waiting: list[PendingJob], jobs: list[RunningJob], views: list[NodeView], *tenants: Tenant
) -> list[Preemption]:
    held: dict[str, Use] = {}
    for r in jobs:
        held[r.tenant] = held.get(r.tenant, Use()).plus(r.gpus, 0, 0)
    demand = {t: u.gpus for t, u in held.items()}
    for w in waiting:
        demand[w.tenant] = demand.get(w.tenant, 0) + w.gpus
    fleet = Use(gpus=sum(len(n.gpus) for n in views))
    fair = FairShare({t.name: t for t in tenants}, held, {}, fleet)
    return preemptions(waiting, jobs, views, fair, demand, NOW)


def full_node_of_a(ran_s: list[float]) -> tuple[list[RunningJob], list[NodeView]]:
    jobs = [running(f"a{i}", "a", [("n", [i])], ran_s=s) for i, s in enumerate(ran_s)]
    return jobs, nodes(("n", len(ran_s), {i: f"a{i}" for i in range(len(ran_s))}))


def test_a_tenant_below_its_guarantee_stops_the_most_recently_started_job_of_one_above_its_share() -> None:
    # Given a holding all 4 GPUs, its jobs started 4000, 3000, 2000 and 1000 s ago
    jobs, views = full_node_of_a([4000, 3000, 2000, 1000])
    # When b, guaranteed 2 GPUs, waits with a 1-GPU job
    (p,) = decide([PendingJob("b0", 0, 9, 1, tenant="b")], jobs, views, Tenant(name="b", guaranteed_gpus=2))
    # Then one job of a goes: the one that started last (least work lost since its checkpoint)
    assert [v.id for v in p.victims] == ["a3"] and p.gpus == {"n-g3"}
    assert p.reasons["a3"] == "preempted for job b0 of tenant b (below its guarantee of 2 GPUs)"


def test_jobs_that_ran_less_than_their_tenants_min_run_time_are_not_preempted() -> None:
    jobs, views = full_node_of_a([4000, 3000, 200, 100])
    waiting = [PendingJob("b0", 0, 9, 2, tenant="b")]
    # a's min run time is 600 s: only its two older jobs may go, and they do
    (p,) = decide(waiting, jobs, views, Tenant(name="b", guaranteed_gpus=2))
    assert sorted(v.id for v in p.victims) == ["a0", "a1"]
    # with a min run time of an hour, none may, and nobody is stopped
    assert (
        decide(waiting, jobs, views, Tenant(name="b", guaranteed_gpus=2), Tenant(name="a", min_run_s=3600))
        == []
    )


def test_nobody_is_stopped_when_the_freed_gpus_would_not_let_the_job_start() -> None:
    # Given a 4-GPU node where a holds 2 GPUs, and c the other 2 with a job that just started
    views = nodes(("n", 4, {0: "a0", 1: "a1", 2: "c0", 3: "c0"}))
    jobs = [
        running("a0", "a", [("n", [0])]),
        running("a1", "a", [("n", [1])]),
        running("c0", "c", [("n", [2, 3])], ran_s=100),
    ]
    tenants = (Tenant(name="b", guaranteed_gpus=4),)
    # When b waits for 4 GPUs on one node, Then stopping a's jobs would not be enough: none stop
    assert decide([PendingJob("b0", 0, 9, 1, tenant="b")], jobs, views, *tenants) != []  # 1 GPU would do
    assert decide([PendingJob("b0", 0, 9, 4, tenant="b")], jobs, views, *tenants) == []
    # And a job that needs a GPU model the fleet lacks stops nobody either
    assert decide([PendingJob("b1", 0, 9, 1, gpu_model="H100", tenant="b")], jobs, views, *tenants) == []


def test_a_multi_node_victim_is_stopped_whole_and_one_victim_is_preferred_to_several() -> None:
    # Given a's gang on n0 and n1 (2 GPUs each), and two of a's single-GPU jobs of lower priority
    views = nodes(("n0", 3, {0: "gang", 1: "gang", 2: "s0"}), ("n1", 3, {0: "gang", 1: "gang", 2: "s1"}))
    jobs = [
        running("gang", "a", [("n0", [0, 1]), ("n1", [0, 1])]),
        running("s0", "a", [("n0", [2])], priority=-1),
        running("s1", "a", [("n1", [2])], priority=-1),
    ]
    # When b (guaranteed 2) waits for 2 GPUs on one node
    (p,) = decide([PendingJob("b0", 0, 9, 2, tenant="b")], jobs, views, Tenant(name="b", guaranteed_gpus=2))
    # Then the gang goes, every member (the two small jobs sit on different nodes: they would not do)
    assert [v.id for v in p.victims] == ["gang"] and p.gpus == {"n0-g0", "n0-g1", "n1-g0", "n1-g1"}


def test_several_victims_only_as_many_as_needed() -> None:
    views = nodes(("n", 4, {0: "a0", 1: "a1", 2: "a2", 3: "a3"}))
    jobs = [running(f"a{i}", "a", [("n", [i])], priority=p) for i, p in enumerate([-5, 3, -5, 0])]
    (p,) = decide([PendingJob("b0", 0, 9, 2, tenant="b")], jobs, views, Tenant(name="b", guaranteed_gpus=2))
    assert sorted(v.id for v in p.victims) == ["a0", "a2"]  # the two of lowest priority


def test_within_a_tenant_a_higher_priority_job_stops_a_lower_one_but_never_a_non_preemptible_one() -> None:
    views = nodes(("n", 2, {0: "low", 1: "pinned"}))
    jobs = [
        running("low", "a", [("n", [0])], priority=0),
        running("pinned", "a", [("n", [1])], priority=-3, preemptible=False),
    ]
    (p,) = decide([PendingJob("urgent", 5, 9, 1, tenant="a")], jobs, views)
    assert [v.id for v in p.victims] == ["low"]
    assert p.reasons["low"] == "preempted for job urgent of tenant a (priority 5 over 0)"
    # a job of the same priority preempts nobody, and nor does a job of a tenant at its guarantee
    assert decide([PendingJob("peer", 0, 9, 1, tenant="a")], jobs, views) == []


def test_a_non_preemptible_job_is_shielded_only_within_its_tenants_guarantee() -> None:
    # Given a guaranteed 3 GPUs (the guarantees oversubscribe the 4 GPUs) holding all 4 GPUs
    def a_jobs(preemptible: bool) -> list[RunningJob]:
        return [
            running(f"a{i}", "a", [("n", [i])], ran_s=4000 - i, preemptible=preemptible) for i in range(4)
        ]

    views = nodes(("n", 4, {i: f"a{i}" for i in range(4)}))
    waiting = [PendingJob("b0", 0, 9, 2, tenant="b")]
    tenants = (Tenant(name="a", guaranteed_gpus=3), Tenant(name="b", guaranteed_gpus=2))
    # When its jobs are preemptible, b (below its guarantee) takes 2 of them back
    (p,) = decide(waiting, a_jobs(True), views, *tenants)
    assert sorted(v.id for v in p.victims) == ["a2", "a3"]
    # When they are not, only the one above a's guarantee could go: not enough, so none does
    assert decide(waiting, a_jobs(False), views, *tenants) == []
    (p,) = decide([PendingJob("b1", 0, 9, 1, tenant="b")], a_jobs(False), views, *tenants)
    assert [v.id for v in p.victims] == ["a3"]


def test_two_waiting_jobs_never_count_on_the_same_victim() -> None:
    jobs, views = full_node_of_a([4000, 3000, 2000, 1000])
    waiting = [PendingJob("b0", 0, 8, 1, tenant="b"), PendingJob("b1", 0, 9, 1, tenant="b")]
    found = decide(waiting, jobs, views, Tenant(name="b", guaranteed_gpus=2))
    assert [(p.job.id, [v.id for v in p.victims]) for p in found] == [("b0", ["a3"]), ("b1", ["a2"])]
    # and b, once at its guarantee, preempts no more
    three = [*waiting, PendingJob("b2", 0, 10, 1, tenant="b")]
    assert len(decide(three, jobs, views, Tenant(name="b", guaranteed_gpus=2))) == 2


def test_gpus_freed_by_a_preemption_wait_for_the_job_it_was_for() -> None:
    # Given b's 2-GPU job that preempted two 1-GPU jobs: one has stopped (n-g0 free), one is stopping
    views = nodes(("n", 4, {1: "v1", 2: "x", 3: "y"}))
    held = {"w": {"n-g0", "n-g1"}}
    queue = PendingQueue([PendingJob("w", 0, 5, 2, tenant="b"), PendingJob("small", 9, 1, 1, tenant="a")])
    # When a pass runs, Then the free GPU is not given to a's small job, older and more urgent as it is
    plan = queue.schedule(Capacity(views), NOW, held=held)
    assert plan.placements == [] and "small" in plan.waiting
    # (without the hold it would have been)
    assert [
        p.job_id for p in PendingQueue(queue.jobs.values()).schedule(Capacity(views), NOW).placements
    ] == ["small"]
    # When the second victim has stopped too, Then the job it was for goes first, on the freed GPUs
    views = nodes(("n", 4, {2: "x", 3: "y"}))
    plan = queue.schedule(Capacity(views), NOW, held=held)
    assert [(p.job_id, p.gpus) for p in plan.placements] == [("w", ("n-g0", "n-g1"))]
