"""State-store races against a real Redis: what one user action and one fleet write do to each other."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from fleet.keys import Keys
from fleet.lifecycle import RetryPolicy, decide
from fleet.models import ON_NODE_STATES, Exit, Gpu, JobSpec, JobState, NodeState, Progress
from fleet.state import JobStore, NodeStore
from fleet.state.nodes import NodeInfo

pytestmark = pytest.mark.integration
LEADER = "ctl-test:1"


class Interleaving(redis.Redis):
    """A real Redis client that runs ``between`` once, right after its first script call while armed:
    it puts a competing write between the Redis commands of one store call, deterministically."""

    between: Callable[[], None] | None = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        if args[0] in ("EVALSHA", "EVAL") and self.between is not None:
            between, self.between = self.between, None
            between()
        return result


@pytest.fixture
def stores(redis_url: str) -> Iterator[tuple[JobStore, JobStore, redis.Redis]]:
    """(the user's store, on an interleaving client; the fleet's store; a plain client)."""
    user = Interleaving.from_url(redis_url, decode_responses=True)
    fleet = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys()
    fleet.set(keys.leader, LEADER)
    yield JobStore(user, keys), JobStore(fleet, keys), fleet
    user.close()
    fleet.close()


def running_job(jobs: JobStore, client: redis.Redis, job_id: str) -> None:
    """A job RUNNING on a live node, placed by the leader as the controller does."""
    node = NodeStore(client, jobs.keys)
    node.heartbeat(
        "n1",
        "agent-1",
        30,
        100.0,
        NodeInfo(gpus=[], cpus=1, memory=1, runtime="process", gpu_backend="simulated"),
    )
    jobs.create(job_id, JobSpec(name="j", command=["true"]), 100.0)
    assert jobs.place(job_id, "n1", [], LEADER, 101.0, "placed on n1") == 1
    for to in (JobState.STARTING, JobState.RUNNING):
        assert jobs.transition(job_id, attempt=1, allowed=ON_NODE_STATES, to=to, reason="", now=102.0)


def test_a_cancel_racing_a_requeue_is_never_lost(stores: tuple[JobStore, JobStore, redis.Redis]) -> None:
    user, fleet, client = stores
    running_job(fleet, client, "j1")
    stale = fleet.get("j1")  # the agent read the job before the user cancelled

    def attempt_fails() -> None:  # the agent records attempt 1's exit 1 from what it read: a retry
        decision = decide(stale, Exit(code=1, reason="exited with code 1"), RetryPolicy(backoff_s=0))
        fleet.transition(
            "j1",
            attempt=1,
            allowed=[JobState.RUNNING],
            to=decision.state,
            reason=decision.reason,
            now=103.0,
            incr=decision.incr,
            release=True,
        )

    # Given a running job, When the user cancels it while its attempt fails and is requeued
    user.redis.between = attempt_fails
    accepted = user.request_cancel("j1", 103.0)
    # Then the cancel was accepted and wins: the job ends CANCELLED, not queued for another attempt
    job = fleet.get("j1")
    assert accepted and user.redis.between is None
    assert (job.state, job.reason) == (JobState.CANCELLED, "cancelled by user")
    assert fleet.queued() == [] and job.finished_at == 103.0


@pytest.mark.parametrize("code", [0, 127], ids=["succeeded", "failed"])
def test_a_cancel_acknowledged_while_an_exit_is_recorded_ends_the_job_cancelled(
    stores: tuple[JobStore, JobStore, redis.Redis], code: int
) -> None:
    user, fleet, client = stores
    running_job(fleet, client, "j3")
    stale = fleet.get("j3")  # the agent read the job before the user cancelled
    final = decide(stale, Exit(code=code, reason=f"exited with code {code}"), RetryPolicy())
    assert final.state == (JobState.SUCCEEDED if code == 0 else JobState.FAILED)  # 127: not retryable

    # Given a running job whose exit the agent records late (as across a Redis failover), When the
    # user's cancel is acknowledged just before that write
    assert user.request_cancel("j3", 103.0)
    ended = fleet.transition(
        "j3", attempt=1, allowed=[JobState.RUNNING], to=final.state, reason=final.reason, now=104.0
    )
    # Then the job ends CANCELLED, as its user was told
    job = fleet.get("j3")
    assert ended and (job.state, job.reason) == (JobState.CANCELLED, "cancelled by user")
    assert job.finished_at == 104.0


def test_a_cancel_racing_a_placement_ends_cancelled_either_way(
    stores: tuple[JobStore, JobStore, redis.Redis],
) -> None:
    user, fleet, client = stores
    running_job(fleet, client, "other")  # registers node n1
    fleet.create("j2", JobSpec(name="j", command=["true"]), 100.0)
    # Given a queued job, When the leader places it in the middle of the user's cancel
    user.redis.between = lambda: fleet.place("j2", "n1", [], LEADER, 103.0, "placed on n1")
    assert user.request_cancel("j2", 103.0)
    # Then either it never left the queue (CANCELLED) or it is flagged for its agent to cancel
    job = fleet.get("j2")
    assert job.state == JobState.CANCELLED or (job.state.on_node and job.cancel_requested)
    assert fleet.queued() == []


def test_the_nodes_changed_feed_names_what_placement_sees_change_and_nothing_else(
    stores: tuple[JobStore, JobStore, redis.Redis],
) -> None:
    _, jobs, client = stores
    nodes = NodeStore(client, jobs.keys)
    gpu = Gpu(uuid="GPU-a", index=0, model="A100", memory_total=80)

    def beat(**changes: Any) -> None:
        info = NodeInfo(
            gpus=[gpu.model_copy(update=changes)],
            cpus=8,
            memory=1 << 30,
            runtime="process",
            gpu_backend="simulated",
        )
        nodes.heartbeat("n1", "agent-1", 30, 100.0, info)

    def changed() -> list[str]:
        names, version = nodes.changed_since(seen[0])
        seen[0] = version
        return names

    seen = [0]
    beat()  # a node joining is a change
    assert changed() == ["n1"]
    beat(utilization=97, temperature=80, memory_used=5)  # usage moves every beat: not a change
    assert changed() == []
    beat(busy="busy: foreign pid 4242 (python)")  # a GPU taken by something else: a change
    assert changed() == ["n1"]
    nodes.set_state("n1", NodeState.CORDONED, "maintenance", 101.0, "ops")
    assert changed() == ["n1"]
    jobs.create("j1", JobSpec(name="j", command=["true"]), 100.0)
    assert jobs.place("j1", "n1", [], LEADER, 101.0, "placed on n1") == 0  # cordoned: refused, no change
    assert changed() == []
    nodes.set_state("n1", NodeState.READY, "", 102.0, "ops")
    assert changed() == ["n1"]
    assert jobs.place("j1", "n1", [], LEADER, 103.0, "placed on n1") == 1
    assert changed() == ["n1"]
    for to in (JobState.STARTING, JobState.RUNNING):  # a launch holds what it was placed with
        assert jobs.transition("j1", attempt=1, allowed=ON_NODE_STATES, to=to, reason="", now=104.0)
    assert changed() == []
    assert jobs.transition(
        "j1",
        attempt=1,
        allowed=ON_NODE_STATES,
        to=JobState.SUCCEEDED,
        reason="exited",
        now=105.0,
        release=True,
    )
    assert changed() == ["n1"]  # leaving the node releases what it held there


def test_a_nodes_labels_are_published_and_a_change_of_them_is_a_change(
    stores: tuple[JobStore, JobStore, redis.Redis],
) -> None:
    _, jobs, client = stores
    nodes = NodeStore(client, jobs.keys)

    def beat(labels: dict[str, str]) -> None:
        info = NodeInfo(
            gpus=[], cpus=8, memory=1 << 30, runtime="process", gpu_backend="simulated", labels=labels
        )
        nodes.heartbeat("n1", "agent-1", 30, 100.0, info)

    beat({"rack": "r1"})
    _, seen = nodes.changed_since(0)
    assert nodes.read(["n1"]).nodes[0].labels == {"rack": "r1"}
    beat({"rack": "r2"})  # moved to another rack: placement must see it
    assert nodes.changed_since(seen)[0] == ["n1"]


def test_an_elastic_jobs_reports_are_kept_per_size_it_was_launched_at(
    stores: tuple[JobStore, JobStore, redis.Redis],
) -> None:
    _, jobs, client = stores
    # Given an elastic job fleet sized at 2 GPUs and batch 128, running its first attempt
    spec = JobSpec.parse(
        {"name": "e", "command": ["x"], "gpus": "1-4", "batch_size": "64-512", "profile": "learn"}
    )
    jobs.create("e", spec, 100.0)
    assert jobs.resize(jobs.get("e"), 2, 128, "sized 2 GPUs", 30.0, 100.5, LEADER)
    NodeStore(client, jobs.keys).heartbeat(
        "n1",
        "agent-1",
        30,
        100.0,
        NodeInfo(gpus=[], cpus=1, memory=1, runtime="process", gpu_backend="simulated"),
    )
    assert jobs.place("e", "n1", [], LEADER, 101.0, "placed on n1") == 1

    def report(attempt: int, rate: float | None) -> None:
        metrics = {} if rate is None else {"samples_per_s": rate, "num_gpus": 99.0}  # what the job claims
        jobs.append_logs_many(
            {("e", attempt, 0): [("1", "x")]}, 100, {("e", attempt): Progress(step=1, metrics=metrics)}
        )

    # When it reports 100 then 200 samples/s: kept under the size fleet launched it at, not the one
    # it claims, each newer report weighing 30 %
    report(1, 100.0)
    assert jobs.get("e").speeds == {"2x128": 100.0}
    report(1, 200.0)
    assert jobs.get("e").speeds == {"2x128": pytest.approx(130.0)}
    # A report without a rate, one of a stale attempt, and an unreadable record change nothing / mend it
    report(1, None)
    report(7, 1000.0)
    assert jobs.get("e").speeds == {"2x128": pytest.approx(130.0)}
    client.hset(jobs.keys.job("e"), "speeds", "{not json")
    assert jobs.get("e").speeds == {}  # a hint: unreadable reads as nothing, the job is not quarantined
    report(1, 50.0)
    assert jobs.get("e").speeds == {"2x128": 50.0}
    # And a job of fixed size keeps no speeds
    jobs.create("f", JobSpec(name="f", command=["x"], gpus=1), 100.0)
    assert jobs.place("f", "n1", [], LEADER, 101.0, "placed on n1") == 1
    jobs.append_logs_many(
        {("f", 1, 0): [("1", "x")]}, 100, {("f", 1): Progress(step=1, metrics={"samples_per_s": 9.0})}
    )
    assert jobs.get("f").speeds == {} and jobs.get("f").progress is not None


def test_an_elastic_jobs_noise_scale_is_kept_from_its_latest_attempts_reports(
    stores: tuple[JobStore, JobStore, redis.Redis],
) -> None:
    _, jobs, client = stores
    spec = JobSpec.parse(
        {"name": "g", "command": ["x"], "gpus": "1-4", "batch_size": "64-512", "profile": "learn"}
    )
    jobs.create("g", spec, 100.0)
    assert jobs.resize(jobs.get("g"), 2, 128, "sized 2 GPUs", 30.0, 100.5, LEADER)
    info = NodeInfo(gpus=[], cpus=1, memory=1, runtime="process", gpu_backend="simulated")
    NodeStore(client, jobs.keys).heartbeat("n1", "agent-1", 30, 100.0, info)
    assert jobs.place("g", "n1", [], LEADER, 101.0, "placed on n1") == 1

    def report(attempt: int, **metrics: float) -> None:
        jobs.append_logs_many(
            {("g", attempt, 0): [("1", "x")]}, 100, {("g", attempt): Progress(step=1, metrics=metrics)}
        )

    # Before any report: none; then the noise scale its report carries, the latest one kept
    assert jobs.get("g").noise_scale == 0.0
    report(1, gns=512.0, samples_per_s=100.0)
    report(1, gns=640.5)
    assert jobs.get("g").noise_scale == 640.5
    # A report without one, with one not positive, or from a stale attempt changes nothing
    report(1, samples_per_s=90.0)
    report(1, gns=-3.0)
    report(4, gns=9999.0)
    assert jobs.get("g").noise_scale == 640.5
