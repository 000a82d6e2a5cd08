"""The controller's reconcile end to end: launches that never finish, claims nobody holds, jobs on
nodes nobody knows. Each of these held GPUs (or a job) forever before."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py

from fleet import Client, JobSpec, JobState
from fleet.bus import node_queue
from fleet.keys import Keys
from fleet.state import JobStore, NodeStore
from tests.conftest import FleetProcs
from tests.integration.inprocess import Harness, info
from tests.support import wait_for

pytestmark = pytest.mark.integration
REQUEUED = "; requeued (retry budget not spent)"


@pytest.fixture
def runtime() -> str:
    return "process"


class GhostNode:
    """A node that heartbeats like a healthy agent but never launches what it is given (its launch
    worker is wedged); with ``starts``, it gets as far as STARTING and hangs there (an image pull
    that never ends)."""

    def __init__(self, client: redis_py.Redis, name: str, starts: bool) -> None:
        self.jobs, self.nodes = JobStore(client, Keys()), NodeStore(client, Keys())
        self.name, self.starts = name, starts
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            self.nodes.heartbeat(self.name, "ghost-agent", 3, time.time(), info(self.name))
            for job in self.jobs.on_node(self.name) if self.starts else []:
                self.jobs.transition(
                    job.id,
                    attempt=job.attempt,
                    allowed=[JobState.SCHEDULED],
                    to=JobState.STARTING,
                    reason="starting",
                    now=time.time(),
                )

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("stuck_in", [JobState.SCHEDULED, JobState.STARTING])
def test_a_launch_that_never_finishes_is_requeued_and_its_node_told_to_stop(
    procs: FleetProcs, client: Client, redis: redis_py.Redis, stuck_in: JobState
) -> None:
    procs.env.update(FLEET_CONTROLLER__SCHEDULED_TIMEOUT_S="1.5", FLEET_CONTROLLER__STARTING_TIMEOUT_S="1.5")
    procs.controller()
    ghost = GhostNode(redis, "t-ghost", starts=stuck_in == JobState.STARTING)
    try:
        procs.wait_nodes(client, 1)
        # Given a job bound to a live node whose agent never gets it past `stuck_in`
        job = client.submit(JobSpec(name="stuck", command=["true"], gpus=1))
        wait_for(lambda: (job.status().node, job.status().state) == ("t-ghost", stuck_in), what=stuck_in)
        client.cordon("t-ghost")  # the requeued job must go elsewhere
        procs.agent("t-a", gpus=1)
        # When its launch deadline passes
        status = job.wait(timeout=60)
    finally:
        ghost.close()
    # Then the job was requeued as an infrastructure fault, retries unspent, and ran on another node
    assert (status.state, status.node, status.attempt) == (JobState.SUCCEEDED, "t-a", 2), procs.logs()
    assert (status.failures, status.infra_requeues) == (0, 1)
    requeue = next(e for e in job.history() if e.state == "QUEUED" and e.attempt == 1)
    limit = "scheduled_timeout_s" if stuck_in == JobState.SCHEDULED else "starting_timeout_s"
    assert requeue.reason.startswith(f"launch timed out: {stuck_in.value} on t-ghost for ")
    assert requeue.reason.endswith(f"({limit} = 1.5){REQUEUED}")
    assert redis.hgetall(Keys().requeues) == {"launch_timeout": "1"}
    # And its GPU on the ghost node is free, and the ghost's agent was sent a Stop for attempt 1
    assert client.node("t-ghost").claims == {}
    sent = [(m["actor_name"], m["kwargs"]["attempt"]) for m in bus_messages(procs, "t-ghost")]
    assert sent == [("launch", 1), ("stop", 1)]


def bus_messages(procs: FleetProcs, node: str) -> list[dict[str, Any]]:
    """The messages waiting in a node's queue (dramatiq's Redis broker: a hash of encoded messages)."""
    url = procs.settings().redis_url_for(procs.settings().bus_db)
    with redis_py.Redis.from_url(url, decode_responses=True) as bus:
        messages = [json.loads(m) for m in bus.hvals(f"fleet:{node_queue(node)}.msgs")]
    return sorted(messages, key=lambda m: m["message_timestamp"])


def test_a_claim_no_attempt_holds_is_released_and_its_gpu_used_again(
    procs: FleetProcs, client: Client, redis: redis_py.Redis
) -> None:
    # orphan claims are found by the full reconcile, every resync interval (30 s by default)
    procs.env["FLEET_CONTROLLER__RESYNC_INTERVAL_S"] = "2"
    procs.one_node(client, "t-a", gpus=1)
    # Given the node's only GPU claimed by an attempt that no job has (a crash left it behind)
    gpu = client.node("t-a").gpus[0].uuid
    redis.hset(Keys().claims, gpu, "vanished:1")
    # When a job needs that GPU
    job = client.submit(JobSpec(name="needs-it", command=["true"], gpus=1))
    # Then the controller releases the orphan claim, logs it once, and the job runs there
    assert job.wait(timeout=30).state == JobState.SUCCEEDED, procs.logs()
    assert job.status().gpus == [gpu]
    log = (procs.root / "controller.log").read_text()
    assert log.count("orphan_claims_released") == 1 and f"{gpu}=vanished:1" in log


@pytest.fixture
def harness(redis_url: str) -> Iterator[Harness]:
    h = Harness(redis_url)
    yield h
    h.close()


def test_a_job_on_a_node_without_a_record_is_requeued(harness: Harness, redis: redis_py.Redis) -> None:
    h, keys = harness, Keys()
    assert h.controller.lease.renew()
    h.node("t-gone")
    h.running("j", "t-gone")
    # Given the node's record and lease vanished (deleted by hand, lost with a Redis restore)
    redis.delete(keys.node("t-gone"), keys.node_lease("t-gone"))
    redis.srem(keys.nodes, "t-gone")
    # When the controller reconciles
    h.controller.reconcile()
    # Then the job is back in the queue without spending retries, and its GPU claim is gone
    job = h.jobs.get("j")
    assert (job.state, job.reason) == (JobState.QUEUED, f"node t-gone has no record{REQUEUED}")
    assert (job.attempt, job.failures, job.infra_requeues, job.node) == (1, 0, 1, None)
    assert redis.hgetall(keys.claims) == {} and redis.hgetall(keys.requeues) == {"node_down": "1"}


def test_a_gang_with_a_member_beside_a_launch_is_left_running(
    harness: Harness, redis: redis_py.Redis
) -> None:
    h = harness
    assert h.controller.lease.renew()
    for name in ("t-a", "t-b"):
        h.node(name, gpus=2)
    # Given a 2-node job running on t-a and t-b, and a full reconcile behind the controller
    h.running_gang("gang", ["t-a", "t-b"])
    h.controller.reconcile()
    # When a job is being launched on t-a, so the next reconcile looks at t-a (and not at t-b)
    h.jobs.create("launch", JobSpec(name="j", command=["true"], gpus=1), time.time())
    assert h.jobs.place("launch", "t-a", ["t-a-g1"], h.controller.lease.value, time.time(), "placed")
    buckets = h.controller.reconcile()
    # Then the multi-node job is left running: its member on t-b is not taken for one on a node
    # without a record
    assert buckets.requeue_lost == ()
    job = h.jobs.get("gang")
    assert (job.state, job.attempt, job.nodes_held) == (JobState.RUNNING, 1, ["t-a", "t-b"])
