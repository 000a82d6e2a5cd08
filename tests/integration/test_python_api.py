"""The Python API as a program uses it: handles like futures, waiting on many, filters."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

import fleet
from fleet import Client, JobCancelled, JobFailed, JobSpec, JobState, SpecError
from tests.conftest import Api, FleetProcs

pytestmark = pytest.mark.integration
T = TypeVar("T")


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def ready(procs: FleetProcs, client: Client) -> Client:
    procs.controller()
    procs.agent("t-py", gpus=2)
    procs.wait_nodes(client, 1)
    return client


def sh(name: str, script: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": name, "command": ["sh", "-c", script], "max_attempts": 1, **fields})


def test_handles_behave_like_futures(ready: Client) -> None:
    ok = ready.submit(sh("ok", "echo one; sleep 0.5; echo two"))
    bad = ready.submit(sh("bad", "exit 4"))
    slow = ready.submit(sh("slow", "sleep 600"))
    # result() gives the final status of a success, and raises with it for a failure
    assert ok.result(timeout=60).state == JobState.SUCCEEDED and ok.done()
    with pytest.raises(JobFailed, match=r"job bad-\w+ FAILED: exited with code 4") as failed:
        bad.result(timeout=60)
    assert failed.value.job.exit_code == 4 and failed.value.exit_code == 1
    # a job still running is not done, and a cancelled one raises JobCancelled
    assert not slow.done()
    slow.cancel()
    with pytest.raises(JobCancelled):
        slow.result(timeout=60)
    # and the logs come as an iterator of lines that ends with the attempt
    assert list(ok.follow_logs()) == ["one", "two"]


def test_wait_and_as_completed_over_many_jobs(ready: Client) -> None:
    quick, later = ready.submit(sh("quick", "true")), ready.submit(sh("later", "sleep 3"))
    done, pending = fleet.wait([quick, later], timeout=60, return_when=fleet.FIRST_COMPLETED)
    assert done == {quick} and pending == {later}
    assert [h.id for h in fleet.as_completed([later, quick], timeout=60)][-1] == later.id
    done, pending = fleet.wait([quick, later], timeout=60)
    assert (done, pending) == ({quick, later}, set())
    with pytest.raises(SpecError, match="return_when"):
        fleet.wait([quick], return_when="SOMETIME")


def test_listing_filters_by_state_user_and_label(api: Api) -> None:
    with api.client(api.token_for("ann", "t")) as ann, api.client(api.token_for("bob", "t")) as bob:
        mine = ann.submit(sh("a", "true", labels={"exp": "7"}))
        bob.submit(sh("b", "true", labels={"exp": "8"}))
        assert [j.id for j in ann.jobs(state="queued", labels={"exp": "7"})] == [mine.id]
        assert [j.id for j in bob.jobs(user="ann")] == [mine.id]
        assert {j.owner for j in ann.listing()} == {"ann", "bob"}  # same tenant: both visible
        with pytest.raises(SpecError, match="state 'runing': expected one of QUEUED"):
            ann.jobs(state="runing")
        cli = subprocess.run([sys.executable, "-m", "fleet", "jobs", "--label", "exp=8", "-o", "json"],
                             env=api.env(), capture_output=True, text=True, timeout=60)  # fmt: skip
        assert [j["owner"] for j in json.loads(cli.stdout)] == ["bob"]


def test_nodes_node_shows_one_node(ready: Client, procs: FleetProcs) -> None:
    for argv in (["nodes", "t-py"], ["nodes", "show", "t-py"]):
        done = subprocess.run([sys.executable, "-m", "fleet", *argv, "-o", "json"], env=procs.cli_env(),
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert json.loads(done.stdout)["name"] == "t-py", done.stderr


def report(step: int, total: int, loss: float) -> str:
    return f"""echo 'fleet-progress {{"step": {step}, "total": {total}, "loss": {loss}}}'"""


def test_progress_is_the_current_attempts_last_report(ready: Client, procs: FleetProcs) -> None:
    # Given a job whose first attempt reports progress and fails, and whose second reports later
    script = (f'if [ "$FLEET_ATTEMPT" = 1 ]; then {report(1, 4, 0.9)}; {report(2, 4, 0.5)}; exit 1; fi; '
              f"sleep 1.5; {report(3, 4, 0.25)}; sleep 600")  # fmt: skip
    job = ready.submit(sh("prog", script, max_attempts=2))
    # Then while the second attempt has not reported yet, the job shows no progress (not the first's)
    until(lambda: job.status().attempt == 2 and job.status().state == JobState.RUNNING, "attempt 2 running")
    assert job.progress() is None
    # And once it reports, the job's progress is that last report
    found = until(lambda: job.progress(), "attempt 2's report")
    assert (found.step, found.total, found.metrics, found.fraction) == (3, 4, {"loss": 0.25}, 0.75)
    # And `fleet jobs` shows it as a percentage, `fleet show` as a bar
    listing = cli(procs, "jobs").splitlines()
    column = listing[0].split().index("PROGRESS")
    assert next(line.split() for line in listing if line.startswith(job.id))[column] == "75%"
    assert "Progress:   [##################------]  75% step 3/4 loss=0.25 (attempt 2" in cli(
        procs, "show", job.id
    )
    job.cancel()


def test_logs_follow_draws_progress_lines_as_a_bar(ready: Client, procs: FleetProcs) -> None:
    job = ready.submit(sh("bar", f"echo start; {report(1, 2, 0.5)}; echo done"))
    job.result(timeout=60)
    followed = cli(procs, "logs", "-f", job.id).splitlines()
    assert followed == ["start", "progress [############------------]  50% step 1/2 loss=0.5", "done"]
    # and the plain log keeps the line as the job printed it
    assert job.logs().splitlines()[1].startswith('fleet-progress {"step": 1')


def cli(procs: FleetProcs, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "fleet", *argv], env=procs.cli_env(), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def until(check: Callable[[], T | None], why: str, timeout: float = 30) -> T:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {why}"
        time.sleep(0.1)
    return found
