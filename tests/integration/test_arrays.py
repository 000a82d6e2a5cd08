"""Job arrays: one submit for a sweep, every task a job that runs once with its own index."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState
from fleet.errors import SpecError
from tests.conftest import Api, FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration

# Each task reports, from inside, its index and its start and end on the kernel's clock.
PROBE = (
    'echo "start $(cut -d" " -f1 /proc/uptime) $FLEET_ARRAY_INDEX"; sleep {secs}; '
    'echo "end $(cut -d" " -f1 /proc/uptime)"'
)


@pytest.fixture
def runtime() -> str:
    return "process"


def sh(script: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": "sweep", "command": ["sh", "-c", script], "gpus": 1, **fields})


@pytest.mark.timeout(600)  # 1,000 processes: its own wait allows that long, the suite's 120 s guard not
def test_each_task_of_a_1000_task_array_runs_once_with_its_own_index(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given a controller and a node with 16 GPUs, and a folder every task may append to
    procs.one_node(client, "t-sweep", gpus=16)
    ran = tmp_path / "ran"
    ran.mkdir()
    ran.chmod(0o777)  # the tasks run as the unprivileged job user

    # When a 1,000-task array of 1-GPU tasks (63 rounds of the node's GPUs), each printing its index
    # and appending it to a file (one write of a few bytes with O_APPEND: whole lines, whichever
    # task writes first), is submitted in one call
    script = 'echo "index=$FLEET_ARRAY_INDEX"; echo "$FLEET_ARRAY_INDEX" >> "$RAN/indexes"'
    array = client.submit_array(sh(script, env={"RAN": str(ran)}), "0-999")
    done = array.wait(timeout=600)

    # Then every task succeeded, each in its first and only attempt
    assert done.tasks[JobState.SUCCEEDED] == 1000, procs.logs()
    tasks = client.jobs(limit=5000)
    assert sorted(t.array_index for t in tasks if t.array_id == array.id) == list(range(1000))
    retried = {
        t.id: [f"{e.state}: {e.reason}" for e in client.job(t.id).history()] for t in tasks if t.attempt != 1
    }
    assert {(t.state, t.attempt) for t in tasks} == {(JobState.SUCCEEDED, 1)}, f"retried: {retried}"
    # And each index ran exactly once, as the tasks themselves wrote it
    assert sorted(int(i) for i in (ran / "indexes").read_text().split()) == list(range(1000))
    # And a task's log and history (a sample across the range) show its own index and one run
    for i in range(0, 1000, 53):
        task = array.task(i)
        assert task.logs() == f"index={i}"
        assert [e.state for e in task.history()].count("RUNNING") == 1
    assert client.nodes()[0].claims == {}


def test_max_running_caps_the_tasks_on_nodes_at_once(procs: FleetProcs, client: Client) -> None:
    # Given a node with 16 free GPUs
    procs.one_node(client, "t-cap", gpus=16)

    # When an 8-task array of 1-second tasks is submitted with at most 2 running
    array = client.submit_array(sh(PROBE.format(secs=1)), "0-7", max_running=2)
    done = array.wait(timeout=90)

    # Then all of them succeed, the task records show the limit
    assert done.tasks[JobState.SUCCEEDED] == 8 and done.max_running == 2, procs.logs()
    assert client.get(f"{array.id}-0").array_max_running == 2
    # And, as the tasks themselves saw it, never more than 2 ran at the same time
    runs = []
    for i in range(8):
        text = array.task(i).logs()
        start, end = re.search(r"start (\S+) (\d+)", text), re.search(r"end (\S+)", text)
        assert start and end and start.group(2) == str(i), text
        runs.append((float(start.group(1)), float(end.group(1))))
    assert max(sum(1 for s, e in runs if s <= t < e) for t, _ in runs) == 2


def test_cancel_an_array_stops_its_running_tasks_and_drops_the_queued(
    procs: FleetProcs, client: Client
) -> None:
    # Given a 20-task array of long tasks on a node with 2 GPUs: 2 running, 18 queued
    procs.one_node(client, "t-cancel", gpus=2)
    array = client.submit_array(sh("sleep 60"), "0-19")
    wait_for(lambda: array.status().tasks[JobState.RUNNING] == 2, timeout=30)

    # When the array is cancelled
    report = array.cancel()

    # Then the queued tasks are cancelled at once and the running ones stopped, then CANCELLED
    assert (len(report.cancelled), len(report.stopping), report.already_final) == (18, 2, 0)
    done = array.wait(timeout=30)
    assert done.tasks[JobState.CANCELLED] == 20, procs.logs()
    assert client.nodes()[0].claims == {}
    # And cancelling it again changes nothing
    assert array.cancel().already_final == 20


def test_cancel_by_label_cancels_only_the_matching_jobs(procs: FleetProcs, client: Client) -> None:
    # Given two running and one queued job labelled team=a (a node with 2 GPUs), and one of team=b
    procs.one_node(client, "t-label", gpus=2)
    team_a = [client.submit(sh("sleep 60", labels={"team": "a"})) for _ in range(2)]
    wait_for(lambda: all(h.status().state == JobState.RUNNING for h in team_a), timeout=30)
    queued_a = client.submit(sh("sleep 60", labels={"team": "a", "run": "x"}))
    team_b = client.submit(sh("sleep 60", labels={"team": "b"}))

    # When every job labelled team=a is cancelled
    report = client.cancel_labels({"team": "a"})

    # Then the queued one is cancelled at once, the running ones stop; team b's job waits on
    assert report.cancelled == [queued_a.id] and sorted(report.stopping) == sorted(h.id for h in team_a)
    assert queued_a.status().state == JobState.CANCELLED
    assert {h.wait(timeout=30).state for h in team_a} == {JobState.CANCELLED}
    wait_for(lambda: team_b.status().state == JobState.RUNNING, timeout=30)


def test_a_resubmitted_array_is_the_same_array(client: Client) -> None:
    # Given an array submitted with a chosen id
    spec = sh("true")
    first = client.submit_array(spec, "0-9,20", array_id="nightly")

    # When the same submit is repeated (a retry), Then it is a no-op
    again = client.submit_array(spec, "0-9,20", array_id="nightly")
    assert again.id == first.id and again.status().tasks[JobState.QUEUED] == 11
    # And the same id with another spec, other indices, or a job's id is refused, creating nothing
    with pytest.raises(SpecError, match="already exists with a different spec"):
        client.submit_array(sh("false"), "0-9,20", array_id="nightly")
    with pytest.raises(SpecError, match="already exists with a different indices"):
        client.submit_array(spec, "0-9", array_id="nightly")
    client.submit(spec, job_id="taken-3")
    with pytest.raises(SpecError, match="task id 'taken-3' of job array 'taken' is taken by another job"):
        client.submit_array(spec, "0-9", array_id="taken")
    with pytest.raises(SpecError, match="is the id of a job array"):
        client.submit(spec, job_id="nightly")
    assert [j.id for j in client.jobs() if j.id.startswith("taken-")] == ["taken-3"]


def test_a_task_reads_as_a_full_job(client: Client) -> None:
    # Given an array submitted with labels
    array = client.submit_array(sh("true", labels={"team": "a"}), "3,5-6", max_running=1)

    # When one of its tasks is read, Then it is an ordinary job with its spec, index and array labels
    task = client.get(f"{array.id}-5")
    assert task.state == JobState.QUEUED and task.spec.command == ["sh", "-c", "true"]
    assert task.spec.labels == {"team": "a", "fleet.array": array.id, "fleet.array.index": "5"}
    assert (task.array_id, task.array_index, task.array_max_running) == (array.id, 5, 1)
    assert [(e.state, e.reason) for e in client.history(task.id)] == [("QUEUED", "submitted")]
    assert sorted(j.id for j in client.jobs()) == [f"{array.id}-{i}" for i in (3, 5, 6)]


@pytest.fixture
def cli(api: Api) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = api.env()
        return subprocess.run(
            [sys.executable, "-m", "fleet", *args], env=env, capture_output=True, text=True, timeout=60
        )

    return run


def test_cli_groups_an_array_on_one_line(cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    # Given a job, then a 100-task array (at most 5 running) of which one task is cancelled
    single = cli("submit", "--name", "single", "--", "true").stdout.strip()
    submitted = cli(
        "submit",
        "--array",
        "0-99",
        "--max-running",
        "5",
        "--label",
        "team=x",
        "--",
        "sh",
        "-c",
        "echo $FLEET_ARRAY_INDEX",
    )
    assert submitted.returncode == 0, submitted.stderr
    array_id = submitted.stdout.strip()
    assert cli("cancel", f"{array_id}-7").returncode == 0

    # When jobs are listed, Then the array is one line with its tasks per state, above the older job
    lines = cli("jobs").stdout.splitlines()
    assert len(lines) == 3 and lines[1].startswith(array_id) and lines[2].startswith(single)
    assert "QUEUED=99 CANCELLED=1" in lines[1] and "job array of 100, max running 5" in lines[1]
    # And as JSON
    listed = json.loads(cli("jobs", "-o", "json").stdout)
    assert [e.get("kind", "job") for e in listed] == ["array", "job"]
    assert listed[0]["id"] == array_id and listed[0]["size"] == 100 and listed[0]["max_running"] == 5
    assert listed[0]["tasks"]["QUEUED"] == 99 and listed[0]["tasks"]["CANCELLED"] == 1
    assert [e["id"] for e in json.loads(cli("jobs", "--state", "cancelled", "-o", "json").stdout)] == [
        array_id
    ]

    # And `fleet show` of the array summarises it, of a task shows the task
    shown = cli("show", array_id).stdout
    assert f"Job array:  {array_id}" in shown and "States:     QUEUED=99 CANCELLED=1" in shown
    assert "Tasks:      100 (indices 0-99), at most 5 on nodes at once" in shown
    task = json.loads(cli("show", f"{array_id}-42", "-o", "json").stdout)
    assert task["array_id"] == array_id and task["array_index"] == 42
    assert task["spec"]["labels"] == {"team": "x", "fleet.array": array_id, "fleet.array.index": "42"}


def test_cli_cancels_in_bulk(cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    # Given an array and a labelled job
    array_id = cli("submit", "--array", "1,3,5-9", "--", "true").stdout.strip()
    labelled = cli("submit", "--label", "run=7", "--", "true").stdout.strip()

    # When the array id is given as a job, Then the user is pointed to --array (exit 3)
    wrong = cli("cancel", array_id)
    assert wrong.returncode == 3 and f"fleet cancel --array {array_id}" in wrong.stderr
    # When the array is cancelled, Then every task is, at once
    cancelled = json.loads(cli("cancel", "--array", array_id, "-o", "json").stdout)
    assert len(cancelled["cancelled"]) == 7 and cancelled["stopping"] == []
    assert "CANCELLED=7" in cli("show", array_id).stdout
    # When cancelled by label, Then the labelled job is
    by_label = cli("cancel", "--label", "run=7")
    assert by_label.stdout.startswith("cancelled 1 queued job(s); stopping 0 on nodes")
    assert json.loads(cli("show", labelled, "-o", "json").stdout)["state"] == "CANCELLED"
    # And a cancel naming nothing, or two things, is a usage error
    assert cli("cancel").returncode == 2 and cli("cancel", labelled, "--array", array_id).returncode == 2


def test_an_array_submitted_after_a_queued_job_was_cancelled_starts_without_a_resync(
    procs: FleetProcs, client: Client
) -> None:
    # Given a controller that reads the whole queue only every 10 minutes, and one node of 2 GPUs
    procs.env["FLEET_CONTROLLER__RESYNC_INTERVAL_S"] = "600"
    procs.one_node(client, "t-left", gpus=2)
    # And a job that waits (it asks more GPUs than the fleet has), cancelled once the controller saw it
    waiting = client.submit(sh("true", gpus=8, allow_unplaceable=True))
    wait_for(lambda: client.get(waiting.id).reason.startswith("fits no registered node"), timeout=30)
    waiting.cancel()
    # When a 2-task array is submitted: as many jobs joined the queue as left it, less the one named
    array = client.submit_array(sh("true"), "0-1")
    # Then both tasks run now, not at the next full read of the queue
    assert array.wait(timeout=60).tasks[JobState.SUCCEEDED] == 2, procs.logs()
