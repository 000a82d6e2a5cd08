"""Multi-node jobs (gangs) in the pure scheduler: split into equal members, placed whole or not at
all, one member per node, with a reason that says what is missing and nodes kept for them."""

from __future__ import annotations

import dataclasses

from fleet.scheduler import Capacity, NodeView, PendingJob, PendingQueue, Snapshot, schedule
from tests.unit.test_scheduler import node


def gang(jid: str, gpus: int, seq: int = 1, **kw: object) -> PendingJob:
    return PendingJob(jid, 0, seq, gpus, **kw)  # type: ignore[arg-type]


def members(plan_placements: list, job_id: str) -> list[tuple[int, str, int]]:  # type: ignore[type-arg]
    return sorted((p.rank, p.node, len(p.gpus)) for p in plan_placements if p.job_id == job_id)


def test_a_job_larger_than_any_node_splits_into_the_fewest_equal_members() -> None:
    four = Capacity([node(f"n{i}", 4) for i in range(4)])
    assert four.split(gang("a", 4)) == (1, 4)  # fits one node: stays one
    assert four.split(gang("b", 8)) == (2, 4)
    assert four.split(gang("c", 6)) == (2, 3)  # leaves a GPU per node to smaller jobs
    assert four.split(gang("d", 12)) == (3, 4)
    assert four.split(gang("e", 7)) == (7, 1)  # a prime: one GPU on each of 7 nodes (pin to avoid)
    assert four.split(gang("h", 2, gpu_model="H100")) == (1, 2)  # no such GPU anywhere: one node
    assert four.split(gang("f", 8, nodes=4)) == (4, 2)  # pinned by the user
    assert four.split(gang("g", 8, gpus_per_node=1)) == (8, 1)


def test_a_gang_is_placed_one_member_per_node_rank_0_first_best_fit() -> None:
    nodes = (
        node("empty", 4),
        node("half", 4, busy={0, 1}),
        node("other", 4),
        node("full", 4, busy={0, 1, 2, 3}),
    )
    plan = schedule(Snapshot((gang("ddp", 8),), nodes), 0)
    assert members(plan.placements, "ddp") == [(0, "empty", 4), (1, "other", 4)]
    assert {p.members for p in plan.placements} == {2}


def test_a_gang_that_does_not_fit_whole_takes_nothing_and_says_what_is_missing() -> None:
    nodes = (node("a", 4), node("b", 4), node("c", 4, busy={0}))
    plan = schedule(Snapshot((gang("big", 12), gang("small", 1, seq=2)), nodes), 0)
    assert members(plan.placements, "big") == []  # never part of a gang
    assert plan.waiting["big"] == "needs 3 nodes with 4 free GPUs each; 2 have them now"
    # and the nodes kept for it are not handed to the later 1-GPU job, which waits
    assert [p.job_id for p in plan.placements] == []
    assert "reserved for a higher-ranked job" in plan.waiting["small"]


def test_a_gang_the_fleet_cannot_hold_keeps_no_node_from_others() -> None:
    nodes = (node("a", 4), node("b", 4))
    plan = schedule(Snapshot((gang("huge", 12), gang("small", 1, seq=2)), nodes), 0)
    assert plan.waiting["huge"] == (
        "fits no registered node: needs 3 nodes with 4 free GPUs each; only 2 nodes could ever hold a member"
    )
    assert members(plan.placements, "small") == [(0, "a", 1)]


def test_two_gangs_that_fit_one_at_a_time_never_hold_parts_of_the_fleet() -> None:
    # Given a fleet of 4 nodes x 2 GPUs and two 2-node gangs of 4 GPUs each wanting the whole fleet
    nodes = [node(f"n{i}", 2) for i in range(4)]
    queue = PendingQueue([gang("g1", 8, seq=1), gang("g2", 8, seq=2), gang("s", 1, seq=3)])
    # When a pass runs, the first gang takes the fleet whole and the second takes nothing
    first = queue.schedule(Capacity(nodes), 0)
    assert members(first.placements, "g1") == [(0, "n0", 2), (1, "n1", 2), (2, "n2", 2), (3, "n3", 2)]
    assert members(first.placements, "g2") == [] and "g2" in first.waiting
    # And once g1 ended, the next pass places g2 whole, still before the later small job
    second = queue.schedule(Capacity(nodes), 1)
    assert len(members(second.placements, "g2")) == 4 and "s" not in {p.job_id for p in second.placements}


def test_a_gang_goes_to_one_rack_when_one_rack_can_hold_it() -> None:
    # Given racks r1 (a1 fullest, a2 empty) and r2 (b1 as full as a1, b2 empty): best fit alone
    # would take a1 and b1, across racks
    def racked(name: str, rack: str, busy: set[int]) -> NodeView:
        return dataclasses.replace(node(name, 4, busy=busy), group=rack)

    nodes = (
        racked("a1", "r1", {0, 1}),
        racked("a2", "r1", set()),
        racked("b1", "r2", {0, 1}),
        racked("b2", "r2", set()),
    )
    plan = schedule(Snapshot((gang("ddp", 4, nodes=2),), nodes), 0)
    # Then both members land in one rack
    assert members(plan.placements, "ddp") == [(0, "a1", 2), (1, "a2", 2)]
    # And without racks, best fit across the fleet
    flat = tuple(dataclasses.replace(n, group="") for n in nodes)
    plan = schedule(Snapshot((gang("ddp", 4, nodes=2),), flat), 0)
    assert members(plan.placements, "ddp") == [(0, "a1", 2), (1, "b1", 2)]
