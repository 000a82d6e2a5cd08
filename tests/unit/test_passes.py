"""One pass (``run_pass``), as the controller and the simulator both run it: the cases the simulator's
own pass used to get wrong (tenant caps on elastic jobs, holds, how many victims one job may have)."""

from __future__ import annotations

from dataclasses import replace

from fleet.models import Tenant
from fleet.scheduler import GpuSlot, NodeView, PendingJob, PendingQueue, RunningJob
from fleet.scheduler import profiles as policy
from fleet.scheduler.passes import MAX_BLOCKED, Hold, PassInput, PassSettings, run_pass
from fleet.scheduler.resizing import Elastic, smaller_growth
from fleet.scheduler.sizing import Size
from fleet.scheduler.snapshot import UNSIZED, held_reason
from fleet.sim import SimConfig, Simulation
from fleet.sim.traces import TraceJob

NOW = 10_000.0


def nodes(count: int, per_node: int = 4, holders: dict[str, str] | None = None) -> list[NodeView]:
    """``count`` nodes n0.. of ``per_node`` GPUs ``n<i>-g<j>``; ``holders``: GPU -> job holding it."""
    held = holders or {}
    return [
        NodeView(
            f"n{i}",
            True,
            gpus=tuple(
                GpuSlot(
                    f"n{i}-g{j}",
                    j,
                    "A100",
                    80 << 30,
                    free=f"n{i}-g{j}" not in held,
                    holder=f"{held[f'n{i}-g{j}']}:1" if f"n{i}-g{j}" in held else "",
                )
                for j in range(per_node)
            ),
        )
        for i in range(count)
    ]


def on(job_id: str, tenant: str, gpus: list[str], ran_s: float = 3600.0) -> RunningJob:
    by_node: dict[str, list[str]] = {}
    for g in gpus:
        by_node.setdefault(g.split("-")[0], []).append(g)
    members = tuple((n, tuple(gs)) for n, gs in by_node.items())
    return RunningJob(job_id, 1, tenant, 0, len(gpus), members, started_at=NOW - ran_s)


def elastic(job_id: str, tenant: str, most: int = 16) -> Elastic:
    cifar10 = policy.named_profile("cifar10")
    return Elastic(job_id, tenant, 1, most, 128, 1024, cifar10, Size(0, 0), running=False)


def test_a_tenants_max_gpus_caps_its_elastic_jobs_beside_its_other_jobs() -> None:
    # 16 free GPUs, tenant t may hold 6 and already runs a 2-GPU job: its elastic job gets at most 4
    views = nodes(5, holders={"n4-g0": "fixed", "n4-g1": "fixed"})
    queue = PendingQueue([PendingJob("e", 0, 1, gpus=0, tenant="t", elastic=True, hold=UNSIZED)])
    fixed = {"fixed": on("fixed", "t", ["n4-g0", "n4-g1"])}
    inp = PassInput(
        queue,
        views,
        {"t": Tenant(name="t", max_gpus=6)},
        fixed,
        {},
        {},
        elastic=[elastic("e", "t")],
        resize=True,
    )
    plan = run_pass(inp, NOW)
    assert [(r.job_id, r.new.gpus) for r in plan.resizes] == [("e", 4)]
    assert sum(len(p.gpus) for p in plan.placements) == 4
    # without the cap it takes what the fleet has free for it
    queue = PendingQueue([PendingJob("e", 0, 1, gpus=0, tenant="t", elastic=True, hold=UNSIZED)])
    uncapped = run_pass(
        PassInput(queue, views, {}, inp.running, {}, {}, elastic=[elastic("e", "t")], resize=True), NOW
    )
    assert uncapped.resizes[0].new.gpus > 4


def test_the_simulator_keeps_a_tenant_within_its_max_gpus() -> None:
    jobs = [TraceJob(f"e{i}", "t", 0.0, gpus=4, batch=512, model="cifar10") for i in range(3)]
    capped = {"t": Tenant(name="t", max_gpus=5)}
    sim = Simulation(jobs, SimConfig("elastic", gpus=16, tenants=capped, model="throughput"))
    result = sim.run()
    assert result.completed == 3
    holding: dict[str, int] = {}
    for _, what, job, gpus in sim.decisions:  # what the tenant holds after each decision
        holding.pop(job, None)
        if what == "placed":
            holding[job] = gpus
        assert sum(holding.values()) <= 5, sim.decisions
    uncapped = Simulation(
        jobs, SimConfig("elastic", gpus=16, model="throughput")
    )  # the cap is what held them back
    uncapped.run()
    assert max(gpus for _, what, _, gpus in uncapped.decisions if what == "placed") > 5


def test_gpus_held_for_a_preempting_job_go_to_it_and_to_nobody_else() -> None:
    # w preempted v (n0-g0, n0-g1); v has left: w gets those GPUs although x ranks before it
    views = nodes(1)
    queue = PendingQueue(
        [PendingJob("x", 0, 1, gpus=2, tenant="a"), PendingJob("w", 0, 2, gpus=2, tenant="b")]
    )
    hold = Hold(frozenset({"n0-g0", "n0-g1"}), frozenset({"v"}), NOW + 60)
    plan = run_pass(PassInput(queue, views, {}, {}, {}, {"w": hold}), NOW)
    assert {p.job_id: set(p.gpus) for p in plan.placements}["w"] == {"n0-g0", "n0-g1"}
    assert plan.holds == {}  # placed: its hold is let go


def test_a_job_with_a_hold_is_not_preempted_for_again_nor_its_gpus_taken() -> None:
    # v is still stopping on n0-g0..1 (held for w, which needs all 4 of n0); n1 has 2 free GPUs and x
    # (tenant a) waits for 2: x goes to n1, nobody takes the held GPUs, w preempts nobody more
    n0 = nodes(1, holders={"n0-g0": "v", "n0-g1": "v", "n0-g2": "a2", "n0-g3": "a2"})[0]
    views = [n0, nodes(2, per_node=2)[1]]
    stopping = on("v", "a", ["n0-g0", "n0-g1"])
    a_more = on("a2", "a", ["n0-g2", "n0-g3"])
    queue = PendingQueue(
        [PendingJob("w", 0, 1, gpus=4, tenant="b"), PendingJob("x", 0, 2, gpus=2, tenant="a")]
    )
    hold = Hold(frozenset({"n0-g0", "n0-g1"}), frozenset({"v"}), NOW + 60)
    policies = {"b": Tenant(name="b", guaranteed_gpus=4)}
    running = {"v": replace(stopping, stopping=True, preempted_for="w"), "a2": a_more}
    plan = run_pass(PassInput(queue, views, policies, running, {}, {"w": hold}), NOW)
    assert [(p.job_id, p.node) for p in plan.placements] == [("x", "n1")]
    assert plan.preemptions == [] and set(plan.holds) == {"w"} and plan.blocked == ["w"]
    # a hold past its time is let go
    queue = PendingQueue([PendingJob("w", 0, 1, gpus=4, tenant="b")])
    assert run_pass(PassInput(queue, views, policies, running, {}, {"w": hold}), NOW + 61).holds == {}


def test_one_job_may_preempt_more_than_16_victims_and_16_blocked_jobs_are_considered() -> None:
    # a holds all 20 GPUs of 5 nodes with 1-GPU jobs; b, guaranteed 20, asks for 20 at once
    views = nodes(5, holders={f"n{i}-g{j}": f"a{i}{j}" for i in range(5) for j in range(4)})
    running = {f"a{i}{j}": on(f"a{i}{j}", "a", [f"n{i}-g{j}"]) for i in range(5) for j in range(4)}
    queue = PendingQueue([PendingJob("big", 0, 1, gpus=20, tenant="b")])
    policies = {"b": Tenant(name="b", guaranteed_gpus=20)}
    plan = run_pass(PassInput(queue, views, policies, running, {}, {}), NOW)
    assert plan.blocked == ["big"]
    (preemption,) = plan.preemptions
    assert preemption.job.id == "big" and len(preemption.victims) == 20
    # with preemption off, nobody is stopped
    off = PassInput(queue, views, policies, running, {}, {}, PassSettings(preemption=False))
    assert run_pass(off, NOW).preemptions == []
    # the first MAX_BLOCKED jobs it could not place are considered: one victim each, no more (each asks
    # its own memory: 20 shapes, all blocked)
    queue = PendingQueue([PendingJob(f"b{i}", 0, i, gpus=1, tenant="b", memory=i + 1) for i in range(20)])
    plan = run_pass(PassInput(queue, views, policies, running, {}, {}), NOW)
    assert len(plan.blocked) == 20 and len(plan.preemptions) == MAX_BLOCKED
    assert [p.job.id for p in plan.preemptions] == [f"b{i}" for i in range(MAX_BLOCKED)]


def test_preemption_plans_on_the_nodes_as_this_pass_left_them() -> None:
    # one free GPU, taken by x in this pass: w (b, guaranteed 2) then needs both of a's GPUs, not one
    views = nodes(1, per_node=3, holders={"n0-g0": "a1", "n0-g1": "a2"})
    running = {"a1": on("a1", "a", ["n0-g0"]), "a2": on("a2", "a", ["n0-g1"])}
    queue = PendingQueue(
        [PendingJob("x", 0, 1, gpus=1, tenant="aa"), PendingJob("w", 0, 2, gpus=2, tenant="b")]
    )
    policies = {"b": Tenant(name="b", guaranteed_gpus=2), "aa": Tenant(name="aa", guaranteed_gpus=1)}
    plan = run_pass(PassInput(queue, views, policies, running, {}, {}), NOW)
    assert [p.job_id for p in plan.placements] == ["x"]  # aa goes first (as far below its guarantee)
    (preemption,) = plan.preemptions
    assert {v.id for v in preemption.victims} == {"a1", "a2"}
    assert preemption.gpus == {"n0-g0", "n0-g1"}


def test_a_sized_elastic_job_the_free_gpus_cannot_hold_starts_smaller_instead_of_waiting() -> None:
    # 4 GPUs sized for e, 6 free, but a fixed job on each node: no node has 4 free; it starts on 3
    views = nodes(2, holders={"n0-g0": "f0", "n1-g0": "f1"})
    running = {"f0": on("f0", "a", ["n0-g0"]), "f1": on("f1", "a", ["n1-g0"])}
    queue = PendingQueue([PendingJob("e", 0, 1, gpus=4, tenant="t", elastic=True)])
    sized = replace(elastic("e", "t"), size=Size(4, 2904))
    plan = run_pass(PassInput(queue, views, {}, running, {}, {}, elastic=[sized]), NOW)
    assert [(r.job_id, r.old.gpus, r.new.gpus, r.running) for r in plan.resizes] == [("e", 4, 3, False)]
    assert [(p.job_id, len(p.gpus)) for p in plan.placements] == [("e", 3)]
    assert "e" not in queue and plan.blocked == [] and "e" not in plan.placed.waiting


def grown(fixed: dict[str, str]) -> list[tuple[str, int, int]]:
    """The resizes of a pass for ``e``, an elastic cifar10 job running long on 2 GPUs of n0 (the
    step grows it to 4), with fixed jobs holding the GPUs ``fixed`` names (GPU -> job)."""
    views = nodes(2, holders={"n0-g0": "e", "n0-g1": "e", **fixed})
    held: dict[str, list[str]] = {"e": ["n0-g0", "n0-g1"]}
    for gpu, job in fixed.items():
        held.setdefault(job, []).append(gpu)
    running = {job: on(job, "t", gpus) for job, gpus in held.items()}
    e = replace(elastic("e", "t"), size=Size(2, 256), running=True, changed_at=0.0)
    plan = run_pass(PassInput(PendingQueue([]), views, {}, running, {}, {}, elastic=[e], resize=True), NOW)
    return [(r.job_id, r.old.gpus, r.new.gpus) for r in plan.resizes]


def test_a_running_elastic_job_grows_as_far_as_the_nodes_hold_or_stays_where_it_is() -> None:
    # 6 GPUs for elastic jobs, the step grows e to 4: no node has 4 once e leaves its 2, but n0 has 3
    assert grown({}) == [("e", 2, 4)]
    assert grown({"n0-g2": "f0", "n1-g0": "f1"}) == [("e", 2, 3)]
    # nowhere more than 2: e keeps running where it is, not restarted at 2 elsewhere
    assert grown({"n0-g2": "f0", "n0-g3": "f0", "n1-g0": "f1", "n1-g1": "f1"}) == []


def test_a_smaller_growth_is_made_only_where_it_pays_for_its_restart() -> None:
    e = replace(elastic("e", "t"), size=Size(2, 256), running=True, arrived_at=NOW - 3600.0)
    assert [s.gpus for s in smaller_growth(e, 4, NOW, resize_cost_s=30.0, gpus_per_node=4)] == [3]
    # resized so often already that 30 s more would not pay within the hour it is expected to run
    worn = replace(e, restarts=120)
    assert smaller_growth(worn, 4, NOW, resize_cost_s=30.0, gpus_per_node=4) == []
    assert smaller_growth(e, 3, NOW, resize_cost_s=30.0, gpus_per_node=4) == []  # only above its size


def test_a_job_the_elastic_step_makes_room_for_stops_nobody_else() -> None:
    # e1 (a, elastic) holds n000 and f1 (a) 2 GPUs of n001; g1 (b, guaranteed 4) arrives for 4 GPUs.
    # The elastic step shrinks e1, whose node comes free for g1: f1 is not stopped as well (it would
    # be placed again at the same instant, restarted for nothing)
    long_s = 10 * 86_400.0
    jobs = [
        TraceJob("e1", "a", 0.0, gpus=0, batch=0, model="imagenet"),
        TraceJob("f1", "a", 0.0, gpus=2, batch=0, duration=long_s),
        TraceJob("g1", "b", 300.0, gpus=4, batch=0, duration=long_s),
    ]
    tenants = {
        "a": Tenant(name="a", max_gpus=6, min_run_s=60),
        "b": Tenant(name="b", guaranteed_gpus=4, min_run_s=60),
    }
    config = SimConfig(
        "elastic",
        gpus=8,
        nodes=2,
        until=1000.0,
        tenants=tenants,
        max_gpus=8,
        objective="speedup",
        resize_cost_s=30,
        min_interval_s=120,
    )
    sim = Simulation(jobs, config)
    sim.run()
    at_300 = [(what, job) for at, what, job, _ in sim.decisions if at == 300.0]
    assert ("resized", "e1") in at_300 and ("placed", "g1") in at_300, sim.decisions
    assert [d for d in sim.decisions if d[1] == "preempted"] == []
    assert [job for at, what, job, _ in sim.decisions if what == "placed" and at > 0].count("f1") == 0


def test_a_job_waiting_for_its_dependencies_is_not_placed_nor_counted_nor_preempted_for() -> None:
    # d (tenant b, below its guarantee) waits for job p; the 2 free GPUs of 4 could hold it
    views = nodes(1, holders={"n0-g0": "a1", "n0-g1": "a1"})
    running = {"a1": on("a1", "a", ["n0-g0", "n0-g1"])}
    policies = {"b": Tenant(name="b", guaranteed_gpus=4)}
    waits = PendingJob("d", 5, 1, gpus=4, tenant="b", hold="waiting for job p to succeed", dependent=True)
    queue = PendingQueue([waits, PendingJob("x", 0, 2, gpus=1, tenant="b")])
    assert queue.demand["b"] == 1  # x's GPU: d asks for none while it waits
    plan = run_pass(PassInput(queue, views, policies, running, {}, {}), NOW)
    assert [p.job_id for p in plan.placements] == ["x"]
    assert plan.placed.waiting["d"] == "waiting for job p to succeed"
    assert plan.preemptions == [] and plan.blocked == []


def test_a_job_a_user_holds_is_not_placed_sized_nor_preempted_for_until_released() -> None:
    # h (tenant b, below its guarantee of 4) is held and ranks first; 4 GPUs, 2 taken by a's job
    views = nodes(1, holders={"n0-g0": "a1", "n0-g1": "a1"})
    running = {"a1": on("a1", "a", ["n0-g0", "n0-g1"])}
    policies = {"b": Tenant(name="b", guaranteed_gpus=4)}
    held = PendingJob("h", 5, 1, gpus=4, tenant="b", hold=held_reason("alice"), held_by="alice")
    sized_later = PendingJob(
        "he", 0, 2, gpus=0, tenant="b", elastic=True, hold=held_reason("bob"), held_by="bob"
    )
    queue = PendingQueue([held, sized_later, PendingJob("x", 0, 3, gpus=1, tenant="b")])
    inp = PassInput(queue, views, policies, running, {}, {}, elastic=[elastic("he", "b")], resize=True)
    plan = run_pass(inp, NOW)
    assert [p.job_id for p in plan.placements] == ["x"]  # the free GPUs go to the job behind it
    assert plan.placed.waiting["h"] == "held by alice" and plan.placed.waiting["he"] == "held by bob"
    assert plan.resizes == [] and plan.preemptions == [] and plan.blocked == []
    assert "h" in queue and queue.demand["b"] == 0  # still queued, asking for nothing meanwhile
    # released: it is placed as soon as it fits, and preempted for when it does not
    queue.add(replace(held, hold="", held_by="", gpus=2))
    assert [
        p.job_id for p in run_pass(PassInput(queue, views, policies, running, {}, {}), NOW).placements
    ] == ["h"]
    queue.add(replace(held, hold="", held_by="", gpus=4))
    plan = run_pass(PassInput(queue, views, policies, running, {}, {}), NOW)
    assert [p.job.id for p in plan.preemptions] == ["h"]
