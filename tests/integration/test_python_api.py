"""The Python API as a program uses it: handles like futures, waiting on many, filters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fleet
from fleet import Client, JobCancelled, JobFailed, JobSpec, JobState, SpecError
from tests.conftest import Api, FleetProcs

pytestmark = pytest.mark.integration


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
