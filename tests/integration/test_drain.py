"""Drains from scripts: jobs finish until the deadline, then checkpoint and move, retries unspent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState, NodeState
from tests.conftest import FleetProcs
from tests.integration.test_dependability import STEPS, progress
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def cli(procs: FleetProcs, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = procs.cli_env()
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_drain_lets_a_short_job_finish_and_moves_a_long_one_from_its_checkpoint(
    procs: FleetProcs, client: Client
) -> None:
    procs.one_node(client, "t-a", gpus=2)
    short = client.submit(
        JobSpec(name="short", gpus=1, command=[sys.executable, "-c", "import time; time.sleep(1)"])
    )
    train = [sys.executable, STEPS, "--steps", "400", "--every", "10", "--sleep", "0.05"]
    train += ["--resumed-sleep", "0"]  # a resumed attempt runs through: nothing is waited for then
    long = client.submit(JobSpec(name="long", gpus=1, command=train))
    wait_for(lambda: max(progress(client, long.id, 1), default=0) >= 20, what="long job checkpointing")
    procs.agent("t-b", gpus=2)
    procs.wait_nodes(client, 2)
    # When t-a is drained with a 3 s deadline and 10 s to checkpoint, and the script waits
    done = cli(procs, "drain", "t-a", "--deadline", "3s", "--grace", "10s", "--wait", "--timeout", "60")
    # Then the command exits 0 once t-a is DRAINED, having shown its progress
    assert done.returncode == 0, done.stdout + done.stderr + procs.logs()
    assert "t-a: DRAINING" in done.stdout and done.stdout.strip().endswith("t-a: DRAINED")
    # The short job finished where it was; the long one checkpointed on SIGTERM and resumed on t-b
    s = short.wait(timeout=10)
    assert (s.state, s.node, s.attempt) == (JobState.SUCCEEDED, "t-a", 1)
    status = long.wait(timeout=120)
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.node, status.attempt, status.failures, status.infra_requeues) == ("t-b", 2, 0, 1)
    assert "stopping on SIGTERM after checkpoint" in long.logs(attempt=1)
    stopped_at = progress(client, long.id, 1)[-1]
    assert f"resumed from step {stopped_at} (attempt 2)" in long.logs(attempt=2)
    requeue = next(e for e in long.history() if e.state == "QUEUED" and e.attempt == 1)
    assert (
        requeue.reason
        == "node t-a drained: exited with code 143 (SIGTERM); requeued (retry budget not spent)"
    )
    # And the drained node takes nothing until uncordoned
    node = json.loads(cli(procs, "nodes", "show", "t-a", "-o", "json").stdout)
    assert node["state"] == "DRAINED" and node["jobs"] == [] and node["changed_by"]
    assert cli(procs, "uncordon", "t-a").returncode == 0
    assert client.node("t-a").state == NodeState.READY


def test_drain_of_several_nodes_cordons_all_first(procs: FleetProcs, client: Client) -> None:
    procs.controller()
    for node in ("t-a", "t-b", "t-c"):
        procs.agent(node, gpus=1)
    procs.wait_nodes(client, 3)
    jobs = [client.submit(JobSpec(name=f"j{i}", gpus=1, command=["sleep", "300"])) for i in range(3)]
    wait_for(lambda: all(j.status().state == JobState.RUNNING for j in jobs), what="one job per node")
    on_ab = [j for j in jobs if j.status().node in ("t-a", "t-b")]
    # When t-a and t-b are force-drained together
    nodes = client.drain(["t-a", "t-b"], force=True, grace_s=1)
    assert {n.admin_state for n in nodes} == {NodeState.DRAINING}
    drained = client.wait_drained(["t-a", "t-b"], timeout=60)
    # Then their jobs went back to the queue, not onto the other node being drained
    assert {n.state for n in drained} == {NodeState.DRAINED}
    for job in on_ab:
        status = job.status()
        assert status.state == JobState.QUEUED and status.failures == 0 and status.infra_requeues == 1
        assert status.node is None
        assert "t-a: drained" in status.reason and "t-b: drained" in status.reason, status.reason
    for job in jobs:
        job.cancel()


def test_a_node_that_dies_mid_drain_ends_drained_with_every_job_accounted_for(
    procs: FleetProcs, client: Client
) -> None:
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(JobSpec(name="j", gpus=1, command=["sleep", "300"]))
    wait_for(lambda: job.status().state == JobState.RUNNING, what="running")
    client.drain(["t-a"], deadline_s=600)
    procs.agent("t-b", gpus=1)
    procs.wait_nodes(client, 2)
    procs.kill_node("t-a")
    (node,) = client.wait_drained(["t-a"], timeout=60)
    assert node.state == NodeState.DOWN and node.admin_state == NodeState.DRAINED and node.jobs == []
    wait_for(
        lambda: (job.status().node, job.status().state) == ("t-b", JobState.RUNNING), what="moved to t-b"
    )
    assert job.status().infra_requeues == 1 and job.status().failures == 0
    job.cancel()


def test_the_documented_maintenance_script_runs_as_written(
    procs: FleetProcs, client: Client, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(JobSpec(name="j", gpus=1, command=["sleep", "300"]))
    wait_for(lambda: job.status().state == JobState.RUNNING, what="running")
    marker = tmp_path / "maintained"
    script = Path(__file__).resolve().parents[2] / "config" / "examples" / "maintain-node.sh"
    env = procs.cli_env(DEADLINE="1s", GRACE="1s", TIMEOUT="60s")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    argv = ["bash", str(script), "t-a", "touch", str(marker)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert marker.exists() and "State:     READY" in done.stdout
    # the job was moved off the node for the maintenance and is placed again once it is back
    wait_for(lambda: job.status().state == JobState.RUNNING and job.status().attempt == 2, what="job back")
    job.cancel()


def test_drain_with_docker_containers_moves_jobs_and_removes_their_containers(
    docker_procs: FleetProcs, client: Client
) -> None:
    import docker

    docker_procs.controller()
    docker_procs.agent("t-da", gpus=1)
    docker_procs.wait_nodes(client, 1)
    # waiting in the background: SIGTERM reaches the whole group, and a shell whose foreground
    # command it kills prints "Terminated" to the log
    script = 'trap "echo checkpointed; exit 143" TERM; echo "attempt $FLEET_ATTEMPT"; sleep 300 & wait'
    job = client.submit(JobSpec(name="svc", gpus=1, command=["sh", "-c", script]))
    wait_for(lambda: "attempt 1" in job.logs(), what="running in a container on t-da")
    docker_procs.agent("t-db", gpus=1)
    docker_procs.wait_nodes(client, 2)
    client.drain(["t-da"], force=True, grace_s=5)
    (node,) = client.wait_drained(["t-da"], timeout=60)
    wait_for(lambda: "attempt 2" in job.logs(), what="running again on t-db")
    status = job.status()
    assert (status.node, status.attempt, status.failures, status.infra_requeues) == ("t-db", 2, 0, 1)
    assert job.logs(attempt=1).splitlines() == ["attempt 1", "checkpointed"]
    left = docker.from_env().containers.list(all=True, filters={"label": "fleet.node=t-da"})
    assert node.state == NodeState.DRAINED and left == []
    job.cancel()
    assert job.wait(timeout=30).state == JobState.CANCELLED
