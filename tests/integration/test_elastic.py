"""Elastic jobs live: the controller resizes a running torch job as the rest of the fleet changes, by
checkpoint and relaunch, and a user or operator may resize one by hand.

Real controller and agent processes on simulated GPUs, the process runtime, and the DDP example
(workers/examples/train_elastic.py), which runs FLEET_NUM_GPUS workers at FLEET_BATCH_SIZE and resumes
from its checkpoint at any size.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState
from fleet.client import JobHandle
from fleet.errors import Forbidden, SpecError
from tests.conftest import Api, FleetProcs, need_torch
from tests.support import wait_for

pytestmark = pytest.mark.integration
EXAMPLE = str(Path(__file__).resolve().parents[2] / "workers" / "examples" / "train_elastic.py")
STEP = re.compile(r"^step (\d+) loss ([0-9.]+) \(workers (\d+), batch (\d+)\)$")


@pytest.fixture
def runtime() -> str:
    need_torch()
    return "process"


def elastic(tmp_path: Path, **fields: object) -> JobSpec:
    """The example, training until ``tmp_path/done`` exists (then it ends at its next checkpoint),
    sized by samples/s (it reports no noise scale: its sizes follow the fleet, not its goodput)."""
    command = [
        sys.executable,
        EXAMPLE,
        "--steps",
        "100000",
        "--every",
        "5",
        "--sleep",
        "0.05",
        "--done-file",
        str(tmp_path / "done"),
        "--no-gns",
    ]
    spec = {
        "name": "elastic",
        "command": command,
        "gpus": {"min": 1, "max": 4},
        "batch_size": {"min": 128, "max": 1024},
        "profile": "cifar10",
        **fields,
    }
    return JobSpec.parse(spec)


def fixed(gpus: int) -> JobSpec:
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    return JobSpec(name=f"fixed{gpus}", gpus=gpus, command=sleep)


def steps(job: JobHandle, attempt: int) -> list[tuple[int, float, int, int]]:
    """(step, loss, workers, batch) of each step the attempt logged."""
    found = [STEP.match(line) for line in job.logs(attempt=attempt).splitlines()]
    return [(int(m[1]), float(m[2]), int(m[3]), int(m[4])) for m in found if m]


def wait_running_at(procs: FleetProcs, job: JobHandle, gpus: int, attempt: int) -> None:
    try:
        wait_for(lambda: running_at(job, gpus, attempt), timeout=60, what=f"{gpus} GPUs at attempt {attempt}")
    except AssertionError:
        status = job.status()
        attempts = range(1, status.attempt + 1)
        logs = "\n".join(f"--- attempt {a}\n{job.logs(attempt=a)[-1500:]}" for a in attempts)
        raise AssertionError(f"{status!r}\n{job.history()}\n{logs}\n{procs.logs()}") from None


def running_at(job: JobHandle, gpus: int, attempt: int | None = None) -> bool:
    """Running at ``gpus`` GPUs and training: its attempt logged steps with that many workers, and a
    checkpoint (each is followed by a progress report)."""
    status = job.status()
    if status.state != JobState.RUNNING or status.num_gpus != gpus or (attempt and status.attempt != attempt):
        return False
    logs = job.logs(attempt=status.attempt)
    logged = steps(job, status.attempt)
    return bool(logged) and logged[-1][2] == gpus and "fleet-progress" in logs  # it has checkpointed


@pytest.mark.timeout(300)  # its own waits allow this long on a slow machine, the suite's 120 s guard not
def test_the_controller_resizes_a_training_job_1_2_4_2_as_the_fleet_changes(
    procs: FleetProcs, client: Client, api: Api, tmp_path: Path
) -> None:
    # Given a node of 4 GPUs, a controller resizing at most every 2 s, a 3-GPU job of fixed size on it
    procs.env.update(
        FLEET_CONTROLLER__ELASTIC_MIN_INTERVAL_S="2",
        FLEET_CONTROLLER__RESIZE_COST_S="1",
        FLEET_CONTROLLER__ELASTIC_INTERVAL_S="0.5",
    )
    procs.one_node(client, "e-a", gpus=4)
    three = client.submit(fixed(3))
    wait_for(lambda: three.status().state == JobState.RUNNING, what="the 3-GPU job running")
    # When an elastic job (1-4 GPUs, batch 128-1024) arrives, it starts on the GPU left
    job = client.submit(elastic(tmp_path))
    wait_running_at(procs, job, 1, 1)
    # When a 2-GPU job queues and the 3-GPU one ends: the 2-GPU job starts, the elastic one grows to 2
    two = client.submit(fixed(2))
    three.cancel()
    wait_running_at(procs, job, 2, 2)
    assert two.status().state == JobState.RUNNING
    # When the 2-GPU job ends: the elastic one takes the whole node
    two.cancel()
    wait_running_at(procs, job, 4, 3)
    # When another 2-GPU job arrives: the elastic one shrinks to 2, and the new job runs beside it
    other = client.submit(fixed(2))
    wait_running_at(procs, job, 2, 4)
    wait_for(lambda: other.status().state == JobState.RUNNING, what="the second 2-GPU job running")
    (tmp_path / "done").touch()
    status = job.wait(timeout=60)
    other.cancel()
    # Then it ends SUCCEEDED after 3 resizes, none spending a retry or an infrastructure requeue
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.attempt, status.resizes, status.failures, status.infra_requeues) == (4, 3, 0, 0)
    # And each attempt ran at its size and resumed where the last one checkpointed; the loss kept falling
    runs = [steps(job, attempt) for attempt in range(1, 5)]
    assert [run[-1][2] for run in runs] == [1, 2, 4, 2]
    for before, after, attempt in zip(runs, runs[1:], range(2, 5), strict=False):
        resumed = before[-1][0]
        assert after[0][0] == resumed + 1
        assert f"resumed from step {resumed} at {after[0][2]} workers" in job.logs(attempt=attempt)
    losses = [sum(loss for _, loss, _, _ in run[-5:]) / 5 for run in runs]
    first = sum(loss for _, loss, _, _ in runs[0][:5]) / 5
    assert first > losses[0] > losses[-1], (first, losses)
    # And the history names each resize, old -> new, requeued without spending a retry
    resizes = [e.reason for e in job.history() if e.state == "QUEUED" and e.attempt > 0]
    assert [re.match(r"resized (\d+) -> (\d+) GPUs", r).groups() for r in resizes] == [  # type: ignore[union-attr]
        ("1", "2"),
        ("2", "4"),
        ("4", "2"),
    ]
    assert all("requeued at its new size (retry budget not spent)" in r for r in resizes), resizes
    # And `fleet show` and the status page say its size, its range and its resizes
    shown = subprocess.run(
        [sys.executable, "-m", "fleet", "show", job.id],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert re.search(
        r"Elastic: +2 GPUs, batch \d+ \(gpus 1-4, batch size 128-1024, profile cifar10\); "
        r"resized 3 times",
        shown,
    ), shown
    auth = {"Authorization": f"Bearer {api.token}"}
    page = urllib.request.Request(f"{api.url}/ui/jobs/{job.id}", headers=auth)
    html = urllib.request.urlopen(page, timeout=30).read().decode()
    assert "resized 3 times" in html and "gpus 1-4" in html


def test_a_user_resizes_their_elastic_job_by_hand_within_its_range(
    procs: FleetProcs, api: Api, tmp_path: Path
) -> None:
    # Given a fleet whose controller does not size elastic jobs itself (each starts at its smallest)
    procs.env.update(FLEET_CONTROLLER__ELASTIC="false")
    procs.controller()
    procs.agent("e-b", gpus=4)
    alice, bob = api.client(api.token_for("alice", "t")), api.client(api.token_for("bob", "t"))
    procs.wait_nodes(alice, 1)
    job = alice.submit(elastic(tmp_path, batch_size={"min": 64, "max": 512}))
    wait_running_at(procs, job, 1, 1)
    assert job.status().batch_size == 64
    # When someone else, a size out of range, or a job that is not elastic is asked for: refused
    with pytest.raises(Forbidden, match="submitted by 'alice'"):
        bob.resize(job.id, 2)
    with pytest.raises(SpecError, match=r"gpus: 5 is outside job .* range 1-4"):
        alice.resize(job.id, 5)
    with pytest.raises(SpecError, match=r"profile cifar10 has no measured throughput .* batch of 16-64"):
        alice.submit(elastic(tmp_path, batch_size={"min": 16, "max": 64}))
    plain = alice.submit(fixed(1))
    with pytest.raises(SpecError, match="is not elastic"):
        alice.resize(plain.id, 2)
    plain.cancel()
    # When its owner resizes it to 2 GPUs with the CLI (the batch scales with them)
    cli = subprocess.run(
        [sys.executable, "-m", "fleet", "resize", job.id, "--gpus", "2"],
        env=procs.cli_env(FLEET_TOKEN=api.token_for("alice", "t")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    # Then it checkpoints, starts again on 2 GPUs at batch 128 and goes on from its checkpoint
    wait_running_at(procs, job, 2, 2)
    status = job.status()
    assert (status.batch_size, status.resizes, status.failures, status.infra_requeues) == (128, 1, 0, 0)
    resumed = steps(job, 1)[-1][0]
    assert f"resumed from step {resumed} at 2 workers, batch 128" in job.logs(attempt=2)
    # And an operator may resize anyone's job (here back to 1 GPU, batch 96)
    operator = api.client(api.token_for("ops", "ops", "operator"))
    operator.resize(job.id, 1, batch_size=96)
    wait_running_at(procs, job, 1, 3)
    (tmp_path / "done").touch()
    assert job.wait(timeout=60).state == JobState.SUCCEEDED
    resizes = [e.reason.split(":")[0] for e in job.history() if e.reason.startswith("resized")]
    assert list(dict.fromkeys(resizes)) == [
        "resized 1 -> 2 GPUs, batch 64 -> 128 by alice",
        "resized 2 -> 1 GPUs, batch 128 -> 96 by ops",
    ]


@pytest.mark.timeout(300)  # its own waits allow this long on a slow machine, the suite's 120 s guard not
def test_an_elastic_job_larger_than_a_node_runs_as_a_gang_and_is_resized_whole(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given two nodes of 2 GPUs each
    procs.env.update(
        FLEET_CONTROLLER__ELASTIC_MIN_INTERVAL_S="2",
        FLEET_CONTROLLER__RESIZE_COST_S="1",
        FLEET_CONTROLLER__ELASTIC_INTERVAL_S="0.5",
    )
    procs.controller()
    procs.agent("g-a", gpus=2)
    procs.agent("g-b", gpus=2)
    procs.wait_nodes(client, 2)
    # When an elastic job of 1-4 GPUs arrives on the empty fleet: it takes all 4, as a gang of 2 x 2
    job = client.submit(elastic(tmp_path))
    wait_running_at(procs, job, 4, 1)
    members = job.status().members
    assert sorted(m.node for m in members) == ["g-a", "g-b"] and [len(m.gpus) for m in members] == [2, 2]
    # When a 2-GPU job arrives: the whole gang checkpoints and the job comes back on one node, beside it
    other = client.submit(fixed(2))
    wait_running_at(procs, job, 2, 2)
    wait_for(lambda: other.status().state == JobState.RUNNING, what="the 2-GPU job running")
    status = job.status()
    assert not status.members and len(status.gpus) == 2 and status.node != other.status().node
    (tmp_path / "done").touch()
    status = job.wait(timeout=60)
    other.cancel()
    # Then it resumed where the gang checkpointed, and ends SUCCEEDED with one resize and no retry spent
    assert (status.state, status.resizes, status.failures, status.infra_requeues) == (
        JobState.SUCCEEDED,
        1,
        0,
        0,
    )
    resumed = steps(job, 1)[-1][0]
    assert f"resumed from step {resumed} at 2 workers" in job.logs(attempt=2)
    assert steps(job, 2)[0][0] == resumed + 1
