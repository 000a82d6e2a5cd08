"""Jobs that wait for other jobs (``after``): a pipeline, its cancellation, and tenants' walls."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleet import Client, JobCancelled, JobState, SpecError
from tests.conftest import Api, FleetProcs
from tests.support import sh, until

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def ready(procs: FleetProcs, client: Client) -> Client:
    procs.one_node(client, "t-deps", gpus=1)
    return client


def test_a_pipeline_whose_first_stage_fails_cancels_the_rest_with_the_reason(ready: Client) -> None:
    # Given a three-stage pipeline whose first stage waits a little, then fails
    first = ready.submit(sh("prep", "sleep 1; exit 3"))
    second = ready.submit(sh("train", "echo train"), after=[first])
    third = ready.submit(sh("eval", "echo eval"), after=[second.id])
    # Then the second stage waits, saying for which job
    until(lambda: "waiting for job " + first.id in second.status().reason, why="second waits for first")
    # When the first fails, the second is cancelled naming it, and the third after it
    with pytest.raises(JobCancelled):
        second.result(timeout=60)
    with pytest.raises(JobCancelled):
        third.result(timeout=60)
    assert second.status().reason == f"dependency {first.id} ended FAILED (after ok)"
    assert third.status().reason == f"dependency {second.id} ended CANCELLED (after ok)"
    assert second.status().finished_at is not None  # an end time, as any cancelled job has


def test_after_any_runs_once_its_dependency_failed(ready: Client) -> None:
    bad = ready.submit(sh("bad", "exit 1"))
    cleanup = ready.submit(sh("cleanup", "echo tidy"), after=[f"{bad.id}:any"])
    on_failure = ready.submit(sh("alert", "echo alert"), after=[f"{bad.id}:notok"])
    assert cleanup.result(timeout=60).state == JobState.SUCCEEDED
    assert on_failure.result(timeout=60).state == JobState.SUCCEEDED


def test_a_dependency_on_another_tenants_job_or_an_unknown_one_is_refused(ready: Client, api: Api) -> None:
    theirs = api.client(api.token_for("bob", "b")).submit(sh("theirs", "sleep 30"))
    mine = api.client(api.token_for("alice", "a"))
    with pytest.raises(SpecError, match=rf"after: no job or array '{theirs.id}' in tenant 'a'"):
        mine.submit(sh("mine", "true"), after=[theirs])
    with pytest.raises(SpecError, match=r"after: no job or array 'nope' in tenant 'a'"):
        mine.submit(sh("mine", "true"), after=["nope"])
    theirs.cancel()


def fleet_cli(procs: FleetProcs, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fleet", *argv],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_cli_waits_for_a_whole_array_and_shows_what_a_job_waits_for(
    ready: Client, procs: FleetProcs
) -> None:
    # Given an array whose task 1 fails, and a job that is still running
    array = ready.submit_array(sh("tasks", "sleep 1; exit $FLEET_ARRAY_INDEX"), "0-1")
    sleeper = ready.submit(sh("sleeper", "sleep 600"))
    # When jobs are submitted after them from the CLI
    after_ok = fleet_cli(procs, "submit", "--after", array.id, "--", "true")
    after_any = fleet_cli(procs, "submit", "--after", f"{array.id}:any", "--after", sleeper.id, "--", "true")
    # Then fleet show says which job each waits for
    shown = f"waiting for job {sleeper.id} to succeed"
    until(lambda: shown in fleet_cli(procs, "show", after_any), why="fleet show naming the sleeper")
    # And once the array ended, the job after all of it succeeding is cancelled naming the failed task
    with pytest.raises(JobCancelled):
        ready.job(after_ok).result(timeout=60)
    assert ready.job(after_ok).status().reason == f"dependency {array.id}-1 ended FAILED (after ok)"
    # while the one after it ending still waits for the sleeper, and is cancelled when the sleeper is
    assert ready.job(after_any).status().state == JobState.QUEUED
    sleeper.cancel()
    with pytest.raises(JobCancelled):
        ready.job(after_any).result(timeout=60)
