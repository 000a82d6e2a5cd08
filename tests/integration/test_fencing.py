"""A controller that lost the leader lease changes nothing: every write it makes is fenced by the token.

The controller runs in this process so that the test decides exactly when it acts: after another
controller took the lease and before this one's next renewal would notice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from fleet.models import JobSpec, JobState, NodeState
from tests.integration.inprocess import Harness

pytestmark = pytest.mark.integration


@pytest.fixture
def harness(redis_url: str) -> Iterator[Harness]:
    h = Harness(redis_url)
    yield h
    h.close()


def test_a_deposed_controller_cannot_requeue_preempt_drain_or_annotate(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h, now = harness, time.time()
    assert h.controller.lease.renew()
    # Given a node that died with a job on it, a draining node past its deadline with a job on it,
    # an empty draining node, and a job that waits for GPUs no node has
    for name in ("dead", "busy", "empty"):
        h.node(name)
    h.running("on-dead", "dead")
    h.running("on-busy", "busy")
    h.client.delete(h.jobs.keys.node_lease("dead"))
    for name in ("busy", "empty"):
        h.nodes.set_state(name, NodeState.DRAINING, "draining", now, drain_deadline=now - 1, drain_grace_s=5)
    h.jobs.create("waits", JobSpec(name="w", command=["true"], gpus=8), now)
    # When another controller takes the lease, and this one runs its passes before it notices
    h.client.set(h.jobs.keys.leader, "c2:99")
    with caplog.at_level(logging.INFO, logger="fleet.controller"):
        h.controller.reconcile()
        h.controller.schedule_pass()
    # Then nothing changed: no requeue, no drain stop, no DRAINED, no waiting reason
    dead, busy, waits = (h.jobs.get(j) for j in ("on-dead", "on-busy", "waits"))
    assert (dead.state, dead.attempt, dead.node) == (JobState.RUNNING, 1, "dead")
    assert (busy.state, busy.preempt) == (JobState.RUNNING, "")
    assert [n.admin_state for n in h.nodes.all() if n.name in ("busy", "empty")] == [NodeState.DRAINING] * 2
    assert (waits.state, waits.reason) == (JobState.QUEUED, "submitted")
    assert h.jobs.requeue_counts() == {} and h.client.get(h.jobs.keys.leader) == "c2:99"
    # And the controller knows it no longer leads
    assert h.controller.lease.value == ""
    assert [r.getMessage().split()[0] for r in caplog.records].count("leadership_lost") == 1
