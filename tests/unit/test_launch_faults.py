"""Which failed starts count toward a node's quarantine, and how the supervisor's refusals are told
apart: a node whose own lease lapsed is slow, not broken."""

from __future__ import annotations

import pytest

from fleet.agent import supervisor as server
from fleet.agent.launcher import counts_against_node
from fleet.agent.supervision import _refused
from fleet.errors import GpuBusy, LaunchError, LeaseUnconfirmed, SpecError


@pytest.mark.parametrize(
    ("exc", "counts"),
    [
        (LaunchError("cannot prepare the attempt on n1: disk full", retryable=True), True),
        (LaunchError("supervisor refused to start the attempt: cannot switch user", retryable=True), True),
        (LaunchError("workdir is no longer stored", retryable=False), False),
        (SpecError("user: jobs may not run as root"), False),
        (GpuBusy("GPU-1 holds a process fleet did not start"), False),
        (LeaseUnconfirmed("supervisor refused to start the attempt: node lease not confirmed"), False),
    ],
)
def test_only_the_nodes_own_faults_in_preparing_count_toward_quarantine(
    exc: LaunchError | SpecError, counts: bool
) -> None:
    # Given a start that failed with exc; Then it counts toward quarantine only when the node could
    # not prepare the attempt
    assert counts_against_node(exc) is counts


def test_a_refusal_for_the_nodes_own_lease_is_told_apart_from_other_refusals() -> None:
    # Given the supervisor's refusal of a start because the lease lapsed
    reply = {"error": f"{server.UNLEASED}: refusing to start an attempt"}
    # Then the agent reads it as a lapsed lease: retryable, and not the node's fault
    with pytest.raises(LeaseUnconfirmed, match="node lease not confirmed") as caught:
        _refused(reply, "supervisor refused to start the attempt")
    assert caught.value.retryable and not counts_against_node(caught.value)
    # And any other refusal stays one the node is blamed for
    with pytest.raises(LaunchError) as other:
        _refused({"error": "cannot put the attempt in its cgroup"}, "supervisor refused to start the attempt")
    assert not isinstance(other.value, LeaseUnconfirmed) and counts_against_node(other.value)
    # And a reply without an error is no refusal
    _refused({"pid": 42}, "supervisor refused to start the attempt")
