"""The node shapes a submit checks against: read every few seconds to accept, afresh to refuse."""

from __future__ import annotations

import pytest

from fleet.api.placeable import SHAPES_TTL_S, Shapes
from fleet.errors import SpecError
from fleet.models import Gpu, JobSpec, Node, NodeState


def node(name: str, gpus: int) -> Node:
    cards = [Gpu(uuid=f"{name}-g{i}", index=i, model="A100", memory_total=80 << 30) for i in range(gpus)]
    return Node(name=name, state=NodeState.READY, alive=True, gpus=cards, cpus=32, memory=256 << 30)


class Fleet:
    """Registered nodes and how often they were read, on a clock the test moves."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.reads, self.now = 0, 0.0

    def read(self) -> list[Node]:
        self.reads += 1
        return list(self.nodes)


def test_a_stream_of_submits_reads_the_nodes_once_per_interval_and_refusals_read_afresh() -> None:
    fleet = Fleet()
    shapes = Shapes(fleet.read, clock=lambda: fleet.now)
    two, eight = JobSpec(name="a", command=["x"], gpus=2), JobSpec(name="b", command=["x"], gpus=8, nodes=1)
    # With no node registered everything is accepted, and every submit looks again
    shapes.check(eight)
    shapes.check(eight)
    assert fleet.reads == 2
    # Once a 4-GPU node joins, the very next submit sees it: 8 GPUs on one node is refused
    fleet.nodes.append(node("n1", 4))
    with pytest.raises(SpecError, match=r"gpus: 8 on one node, but the largest node has 4"):
        shapes.check(eight)
    # Jobs that fit are accepted from what was read, within the interval
    before = fleet.reads
    for _ in range(100):
        shapes.check(two)
    assert fleet.reads == before
    fleet.now += SHAPES_TTL_S
    shapes.check(two)
    assert fleet.reads == before + 1
    # And a refusal is decided on a fresh read: an 8-GPU node that joined a moment ago counts
    fleet.nodes.append(node("n2", 8))
    shapes.check(eight)
    # unless the spec allows a node not registered yet
    shapes.check(JobSpec(name="c", command=["x"], gpus=64, nodes=1, allow_unplaceable=True))
