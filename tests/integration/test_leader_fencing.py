"""A controller that lost the leader lease changes nothing: every write it makes is fenced by the token.

The controller runs in this process so that the test decides exactly when it acts: after another
controller took the lease and before this one's next renewal would notice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from fleet.errors import NotLeader
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


def test_every_fenced_store_write_refuses_a_stale_leader_and_changes_nothing(harness: Harness) -> None:
    h, now = harness, time.time()
    assert h.controller.lease.renew()
    stale = h.controller.lease.value
    h.node("n1")
    h.running("j", "n1")
    h.client.hset(h.jobs.keys.claims, "n1-g9", "vanished:1")
    h.client.hset(h.jobs.keys.job("j"), "spec", "{")  # unreadable, for the quarantine
    before = {k: h.client.dump(k) for k in h.client.keys("*")}
    # Given another controller took the lease
    h.client.set(h.jobs.keys.leader, "c2:99")
    # When the deposed one tries each kind of write with its old token
    writes = {
        "requeue": lambda: h.jobs.transition(
            "j",
            attempt=1,
            allowed=[JobState.RUNNING],
            to=JobState.QUEUED,
            reason="node down",
            now=now,
            release=True,
            leader=stale,
        ),
        "drain stop": lambda: h.jobs.transition(
            "j",
            attempt=1,
            allowed=[JobState.RUNNING],
            to=None,
            reason="drain",
            now=now,
            fields={"preempt": "x"},
            leader=stale,
        ),
        "drained": lambda: h.nodes.set_state("n1", NodeState.DRAINED, "drained", now, leader=stale),
        "orphan claims": lambda: h.jobs.release_orphan_claims([("n1-g9", "vanished:1")], stale),
        "quarantine job": lambda: h.jobs.quarantine("j", "spec: bad", now, stale),
        "quarantine node": lambda: h.nodes.quarantine("n1", "state: bad", stale),
        "place": lambda: h.jobs.place("j", "n1", [], stale, now, "placed"),
        "expire jobs": lambda: h.controller.retention.expire_jobs(["j"], now, now, 60, stale),
        "remove node": lambda: h.controller.retention.remove_node("n1", now, stale),
    }
    not_fenced = []
    for name, write in writes.items():
        try:
            write()
            not_fenced.append(name)
        except NotLeader:
            pass
    # Then every one is refused, and Redis holds exactly what it held before (but the new leader key)
    assert not_fenced == []
    after = {k: h.client.dump(k) for k in h.client.keys("*") if k != h.jobs.keys.leader}
    assert after == {k: v for k, v in before.items() if k != h.jobs.keys.leader}
