"""A job's life on one node, on both runtimes: success, failure, bad image, cancel (retries: on the
in-memory harness, test_memfleet.py)."""

from __future__ import annotations

import sys

import docker
import pytest

from fleet import Client, JobSpec, JobState
from fleet.agent.cgroups import detect
from tests.conftest import FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def one_node(procs: FleetProcs, client: Client) -> FleetProcs:
    procs.one_node(client, "t-node1", gpus=2)
    return procs


def sh(script: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": "t", "command": ["sh", "-c", script], **fields})


def test_job_runs_to_success_with_its_logs(one_node: FleetProcs, client: Client) -> None:
    # Given a one-node fleet, When a 1-GPU job that prints is submitted
    job = client.submit(sh('echo "hello $FLEET_JOB_ID"; echo "gpus=$CUDA_VISIBLE_DEVICES"', gpus=1))
    status = job.wait(timeout=60)
    # Then it succeeds, ran on the node with one GPU, and its output is kept
    assert status.state == JobState.SUCCEEDED, one_node.logs()
    assert status.exit_code == 0 and status.node == "t-node1" and len(status.gpus) == 1
    assert job.logs().splitlines() == [f"hello {job.id}", f"gpus={status.gpus[0]}"]
    assert [e.state for e in job.history()] == ["QUEUED", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert client.nodes()[0].claims == {}
    assert client.job(job.id).logs() == job.logs()  # a handle for an existing job id


def test_nonzero_exit_fails_with_code_and_reason(one_node: FleetProcs, client: Client) -> None:
    job = client.submit(sh("echo boom; exit 3", max_attempts=1))
    status = job.wait(timeout=60)
    assert status.state == JobState.FAILED
    assert status.exit_code == 3
    assert "exited with code 3" in status.reason and "1 of 1 attempts used" in status.reason
    assert job.logs() == "boom"


def test_cancel_stops_a_running_job_and_frees_its_gpus(
    one_node: FleetProcs, client: Client, runtime: str
) -> None:
    job = client.submit(sh("echo started; sleep 300", gpus=2))
    wait_for(lambda: job.status().state == JobState.RUNNING and "started" in job.logs())
    job.cancel()
    status = job.wait(timeout=30)
    assert status.state == JobState.CANCELLED
    assert client.nodes()[0].claims == {}
    if runtime == "docker":
        names = [
            c.name
            for c in docker.from_env().containers.list(all=True, filters={"label": "fleet.node=t-node1"})
        ]
        assert names == []
    # and the freed GPUs take the next job
    assert client.submit(sh("true", gpus=2)).wait(timeout=30).state == JobState.SUCCEEDED


def test_cancel_of_a_queued_job_is_immediate(one_node: FleetProcs, client: Client) -> None:
    # no such GPU here: queued for a node not registered yet, and stays queued
    job = client.submit(sh("true", gpus=2, gpu_model="H100", allow_unplaceable=True))
    wait_for(lambda: "has 0 matching GPUs" in job.status().reason)
    assert job.cancel().state == JobState.CANCELLED


def test_a_job_larger_than_the_fleet_stays_queued_with_the_reason(
    one_node: FleetProcs, client: Client
) -> None:
    # 8 GPUs on one node of 2: a 4-node job, which this fleet cannot hold yet (queued for nodes to come)
    job = client.submit(sh("true", gpus=8, allow_unplaceable=True))
    wait_for(lambda: job.status().reason != "submitted")
    status = job.status()
    assert status.state == JobState.QUEUED
    assert status.reason == (
        "fits no registered node: needs 4 nodes with 2 free GPUs each; only 1 node could ever hold a member"
    )
    # and one whose member is larger than any node says which node lacks what
    pinned = client.submit(sh("true", gpus=8, nodes=2, allow_unplaceable=True))
    wait_for(lambda: pinned.status().reason != "submitted")
    assert (
        pinned.status().reason == "fits no registered node: needs 2 nodes with 4 free GPUs each; only 0 "
        "nodes could ever hold a member (t-node1: has 2 matching GPUs)"
    )


def test_missing_image_fails_the_job_readably(one_node: FleetProcs, client: Client, runtime: str) -> None:
    if runtime != "docker":
        pytest.skip("the process runtime has no images")
    job = client.submit(sh("true", image="fleet/no-such-image:1"))
    status = job.wait(timeout=60)
    assert status.state == JobState.FAILED
    assert status.reason == "image 'fleet/no-such-image:1' not found on node t-node1; not retryable"
    # the agent is still serving
    assert client.submit(sh("true")).wait(timeout=30).state == JobState.SUCCEEDED


def test_docker_container_gets_limits_labels_and_no_privileges(
    one_node: FleetProcs, client: Client, runtime: str
) -> None:
    if runtime != "docker":
        pytest.skip("docker only")
    job = client.submit(sh("sleep 300", gpus=1, memory="64m", cpus=0.5, shm_size="16m"))
    wait_for(lambda: job.status().state == JobState.RUNNING)
    status = job.status()
    container = docker.from_env().containers.get(f"fleet-{job.id}-1")
    host = container.attrs["HostConfig"]
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert container.labels == {"fleet.job": job.id, "fleet.attempt": "1", "fleet.node": "t-node1"}
    assert host["Privileged"] is False and host["Init"] is True
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd") and host["PidsLimit"] == 4096  # the default
    assert (host["Memory"], host["NanoCpus"], host["ShmSize"]) == (64 << 20, 500_000_000, 16 << 20)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == status.gpus[0]
    assert env["FLEET_JOB_ID"] == job.id and env["FLEET_ATTEMPT"] == "1"
    job.cancel()
    assert job.wait(timeout=30).state == JobState.CANCELLED


def test_oom_kill_is_reported_with_the_memory_limit(
    one_node: FleetProcs, client: Client, runtime: str
) -> None:
    if runtime == "process" and detect().kind == "none":
        pytest.skip("the process runtime limits memory through cgroups, and here there are none")
    job = client.submit(sh("head -c 200m /dev/zero | tail > /dev/null", memory="16m", max_attempts=2))
    status = job.wait(timeout=120)
    # OOM spends the retry budget like any job fault (the default policy), with the limit in the reason
    assert status.state == JobState.FAILED and status.attempt == 2 and status.exit_code == 137
    assert status.reason == "OOMKilled (memory limit 16 MiB); 2 of 2 attempts used"
    retried = [e for e in job.history() if e.state == "QUEUED" and e.attempt == 1]
    assert retried[0].reason.startswith("OOMKilled (memory limit 16 MiB); retry 2 of 2 in")


def test_a_script_that_is_not_there_fails_at_once_not_after_its_retries(
    one_node: FleetProcs, client: Client, runtime: str
) -> None:
    # Given `python train.py` where no train.py is (python says "can't open file" and exits 2)
    if runtime == "docker":
        try:
            docker.from_env().images.get("localhost/fleet/torch:latest")
        except docker.errors.ImageNotFound:
            pytest.skip("localhost/fleet/torch image missing (make images-test)")
        image = "localhost/fleet/torch:latest"
        spec = JobSpec(name="t", image=image, command=["python3", "no_such_train.py"])
    else:
        spec = JobSpec(name="t", command=[sys.executable, "no_such_train.py"])
    # When it is submitted with three attempts allowed
    status = client.submit(spec.model_copy(update={"max_attempts": 3})).wait(timeout=90)
    # Then it fails after the first, saying why, and is not retried
    assert status.state == JobState.FAILED and status.attempt == 1, status.reason
    assert "can't open file" in status.reason and "no_such_train.py" in status.reason
    assert status.reason.endswith("not retryable")
