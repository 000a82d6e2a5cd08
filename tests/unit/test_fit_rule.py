"""Whether a job's CPUs and memory fit a node is one rule (fleet.scheduler.feasible.short_of): the
placement follows it, and the waiting reason names what it found short."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.scheduler import Capacity, NodeView, PendingJob
from fleet.scheduler.feasible import short_of

GiB = 1 << 30


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([0.0, 4.0, 16.0]),  # the node's CPUs (0: not reported, not checked)
    st.sampled_from([0.0, 0.5, 3.9, 4.0, 12.0]),  # of which granted
    st.sampled_from([0, 8 * GiB, 64 * GiB]),  # its memory
    st.sampled_from([0, 4 * GiB, 60 * GiB]),  # of which granted
    st.sampled_from([0.0, 0.1, 4.0, 8.0, 20.0]),  # the job's CPUs
    st.sampled_from([0, 1 * GiB, 8 * GiB, 100 * GiB]),  # its memory
)
def test_the_placement_and_the_waiting_reason_follow_one_rule(
    cpus: float, used_cpus: float, memory: int, used_memory: int, job_cpus: float, job_memory: int
) -> None:
    node = NodeView(
        "n1",
        True,
        cpus=cpus,
        used_cpus=min(used_cpus, cpus),
        memory=memory,
        used_memory=min(used_memory, memory),
    )
    job = PendingJob("j", 0, 1, 0, cpus=job_cpus, memory=job_memory)
    short = short_of(job, node, node.cpus - node.used_cpus, node.memory - node.used_memory)
    placed = Capacity([node]).place(job)
    assert (placed is not None) == (short is None)
    if short is not None:
        why, _ = Capacity([node]).explain(job)
        assert short in why, why
    else:
        assert placed is not None and (placed[0].cpus, placed[0].memory) == (job_cpus, job_memory)


def test_a_node_that_reports_no_cpus_or_memory_is_not_checked_for_them() -> None:
    job = PendingJob("j", 0, 1, 0, cpus=64.0, memory=512 * GiB)
    assert short_of(job, NodeView("n1", True), 0.0, 0) is None
    assert short_of(job, NodeView("n1", True, cpus=8.0), 8.0, 0) == "CPUs"
    assert short_of(job, NodeView("n1", True, memory=GiB), 0.0, GiB) == "memory"
