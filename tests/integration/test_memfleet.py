"""A job's life decided by the real controller and agent, with attempts run in memory on a manual
clock (``memfleet.py``): what the controller and agent do with exits, retries and time limits,
without processes. What only real processes show stays in ``test_jobs.py``, ``test_time_limits.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.models import JobState
from tests.integration.memfleet import MemFleet

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[MemFleet]:
    held = MemFleet(redis_url, tmp_path, {"m-node1": 2}, retry_backoff_s=30)
    yield held
    held.close()


def sh(script: str, **fields: object) -> dict[str, object]:
    return {"name": "t", "command": ["sh", "-c", script], **fields}


def test_a_job_runs_on_the_node_to_success_with_its_output(fleet: MemFleet) -> None:
    # Given a job that prints and works for a minute
    job_id = fleet.submit(sh("echo hello; sleep 60; echo done", gpus=1))
    fleet.settle()
    # Then it runs on the node, holding one GPU, until its minute is up
    job = fleet.job(job_id)
    assert (job.state, job.nodes_held, len(job.gpus)) == (JobState.RUNNING, ["m-node1"], 1)
    fleet.advance(59)
    assert fleet.job(job_id).state == JobState.RUNNING
    fleet.advance(1)
    # And then it succeeded, with its output kept and its GPU free
    job = fleet.job(job_id)
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert fleet.jobs.log_tail(job_id, 1, 10) == ["hello", "done"]
    assert [e.state for e in fleet.jobs.history(job_id)] == [
        "QUEUED",
        "SCHEDULED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert fleet.nodes.get("m-node1").claims == {}
    assert fleet.runtimes["m-node1"].attempts() == []  # the agent removed the ended attempt


def test_failed_attempts_are_retried_after_the_backoff_until_the_budget_is_spent(fleet: MemFleet) -> None:
    # Given a job that fails at once, with two attempts
    job_id = fleet.submit(sh("echo failing; exit 1", max_attempts=2))
    fleet.settle()
    # Then its first attempt failed and it waits out the retry backoff, queued
    job = fleet.job(job_id)
    assert (job.state, job.attempt, job.failures) == (JobState.QUEUED, 1, 1)
    requeue = [e for e in fleet.jobs.history(job_id) if e.state == "QUEUED" and e.attempt == 1]
    assert requeue and "retry 2 of 2" in requeue[0].reason
    fleet.advance(29)
    assert fleet.job(job_id).state == JobState.QUEUED
    # And once the backoff is over, the second attempt runs, fails, and the job has failed
    fleet.advance(1)
    job = fleet.job(job_id)
    assert (job.state, job.attempt, job.failures, job.exit_code) == (JobState.FAILED, 2, 2, 1)
    assert "exited with code 1" in job.reason and "2 of 2 attempts used" in job.reason
    assert fleet.jobs.log_tail(job_id, 1, 10) == ["failing"] == fleet.jobs.log_tail(job_id, 2, 10)
    assert [spec.attempt for spec in fleet.runtimes["m-node1"].started] == [1, 2]


def test_a_job_past_its_time_limit_is_stopped_and_fails_without_a_retry(fleet: MemFleet) -> None:
    job_id = fleet.submit({"name": "slow", "command": ["sleep", "600"], "timeout": "2m", "max_attempts": 3})
    fleet.settle()
    fleet.advance(119)
    assert fleet.job(job_id).state == JobState.RUNNING
    fleet.advance(2)
    job = fleet.job(job_id)
    assert (job.state, job.attempt) == (JobState.FAILED, 1)
    # stopped by SIGTERM, which it obeyed, and not retried though it had attempts left
    assert job.reason == "time limit of 120s reached: exited with code 143 (SIGTERM); not retryable"
    assert fleet.runtimes["m-node1"].started[0].attempt == 1 and len(fleet.runtimes["m-node1"].started) == 1


def test_a_cancelled_job_that_ignores_sigterm_is_killed_after_the_grace(fleet: MemFleet) -> None:
    # Given a running 2-GPU job that ignores SIGTERM
    job_id = fleet.submit(sh("trap '' TERM; echo started; sleep 300", gpus=2))
    fleet.settle()
    assert fleet.job(job_id).state == JobState.RUNNING
    # When it is cancelled
    before = fleet.clock()
    fleet.cancel(job_id)
    fleet.settle()
    # Then it got SIGTERM, and SIGKILL once the node's grace was over, and is CANCELLED
    assert fleet.runtimes["m-node1"].started[0].job_id == job_id
    grace = fleet.settings.agent.stop_grace_s
    assert fleet.clock() - before >= grace
    job = fleet.job(job_id)
    assert (job.state, job.exit_code) == (JobState.CANCELLED, 137)
    assert fleet.nodes.get("m-node1").claims == {}
    # And the freed GPUs take the next job
    next_id = fleet.submit(sh("exit 0", gpus=2))
    fleet.settle()
    assert fleet.job(next_id).state == JobState.SUCCEEDED


def test_a_job_left_waiting_starts_when_the_placed_jobs_end_before_the_node_is_read(fleet: MemFleet) -> None:
    # Given three 1-GPU jobs of 10 s for a node of two GPUs, and a pass that placed two of them
    ids = [fleet.submit(sh("sleep 10", gpus=1)) for _ in range(3)]
    fleet.bus.deliver()
    fleet.controller.schedule_pass()
    assert [fleet.job(i).state for i in ids] == [JobState.SCHEDULED, JobState.SCHEDULED, JobState.QUEUED]
    # When both run and end before the controller reads the node again (it reads it as it was
    # before that pass: both GPUs free)
    fleet.bus.deliver()
    fleet.clock.advance(10)
    fleet.runtimes["m-node1"].poll()
    fleet.bus.deliver()
    assert [fleet.job(i).state for i in ids[:2]] == [JobState.SUCCEEDED, JobState.SUCCEEDED]
    assert fleet.nodes.get("m-node1").claims == {}
    # Then the third starts on the GPUs they left
    fleet.settle()
    assert fleet.job(ids[2]).state == JobState.RUNNING
    fleet.advance(10)
    assert fleet.job(ids[2]).state == JobState.SUCCEEDED


def test_an_error_finishing_an_exit_leaves_it_to_the_next_reconcile(
    fleet: MemFleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a running job, and an agent whose first try at finishing an exit raises what no code
    # expects (as Docker did: a container removed between listing and inspecting it)
    job_id = fleet.submit(sh("sleep 10", gpus=1))
    fleet.settle()
    exits = fleet.agents["m-node1"].exits
    finish, tries = exits.finish, []

    def broken_once(*args: Any) -> bool:
        tries.append(args)
        if len(tries) == 1:
            raise RuntimeError("404 Client Error: Not Found for url: .../containers/c1/json")
        return finish(*args)

    monkeypatch.setattr(exits, "finish", broken_once)
    # When the job ends
    fleet.advance(10)
    # Then the error is logged with its traceback, and the agent's next reconcile finished the job
    assert fleet.job(job_id).state == JobState.SUCCEEDED and len(tries) == 2
    assert "exit_not_recorded" in caplog.text and "RuntimeError: 404 Client Error" in caplog.text
    assert fleet.nodes.get("m-node1").claims == {}


def test_the_elastic_step_changes_a_following_jobs_batch_where_it_runs(
    redis_url: str, tmp_path: Path
) -> None:
    # Given an elastic job on 2 GPUs, started at the batch of most samples/s there (nothing else known),
    # under a controller that reads every job on a node (a report reaches it so) at each pass
    quick = {"resync_interval_s": 0.001, "elastic_interval_s": 0.001}
    fleet = MemFleet(redis_url, tmp_path, {"m-node1": 2}, controller=quick)
    try:
        # whose report then says it follows its batch, with a noise scale small enough that a
        # smaller batch makes more progress (each of a large batch's samples is worth less)
        report = '{"step": 10, "samples_per_s": 900, "gns": 200, "batch_size": 726, "follows_batch": 1}'
        spec = sh(
            f"echo 'fleet-progress {report}'; sleep 3600",
            gpus={"min": 2, "max": 2},
            batch_size={"min": 128, "max": 1024},
            profile="cifar10",
        )
        job_id = fleet.submit(spec)
        fleet.settle()
        # When its report reaches its record, the controller reads it and the elastic step runs
        fleet.agents["m-node1"].logs.ship_logs()
        fleet.advance(1)
        # Then its batch shrank where it runs: the same attempt on the same GPUs, told its new batch
        job = fleet.job(job_id)
        assert (job.state, job.attempt, job.num_gpus, job.resizes) == (JobState.RUNNING, 1, 2, 0)
        assert 128 <= job.batch_size < 726 and job.resize_gpus is None and job.noise_scale == 200
        assert fleet.runtimes["m-node1"].batch_of(job_id, 1) == job.batch_size
        reasons = [e.reason for e in fleet.jobs.history(job_id)]
        assert "sized 2 GPUs, batch 726 by the elastic step" in reasons
        assert f"batch 726 -> {job.batch_size} in place by the elastic step" in reasons
    finally:
        fleet.close()
