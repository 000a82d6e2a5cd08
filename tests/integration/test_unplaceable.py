"""A job no registered node could ever hold is refused at submit, naming the field and the largest
node, instead of queueing in silence; ``--allow-unplaceable`` queues it for a node not registered yet.

Through the session's real ``fleet api`` process (HTTP, real Redis) and the CLI as a subprocess;
nodes are registered as their agents' heartbeats register them, with simulated GPUs.
"""

from __future__ import annotations

import time

import pytest
import redis

from fleet import JobSpec, JobState
from fleet.errors import SpecError
from fleet.keys import Keys
from fleet.models import Gpu
from fleet.state import NodeStore
from fleet.state.nodes import NodeInfo
from tests.conftest import Api
from tests.integration.test_api import fleet, spec

pytestmark = pytest.mark.integration

GiB = 1 << 30


def register(
    api: Api, name: str, gpus: int = 4, model: str = "NVIDIA A100-SXM4-80GB", cpus: int = 32
) -> None:
    """A node with ``gpus`` simulated GPUs, ``cpus`` CPUs and 256 GiB memory, as its heartbeat says."""
    inventory = [Gpu(uuid=f"{name}-g{i}", index=i, model=model, memory_total=80 * GiB) for i in range(gpus)]
    info = NodeInfo(gpus=inventory, cpus=cpus, memory=256 * GiB, runtime="process", gpu_backend="simulated")
    client = redis.Redis.from_url(api.redis_url, decode_responses=True)
    NodeStore(client, Keys()).heartbeat(name, f"agent-{name}", 30, time.time(), info)
    client.close()


def test_a_job_no_registered_node_could_hold_is_refused_naming_the_field_and_the_largest(api: Api) -> None:
    # Given a fleet of two 4-GPU A100 nodes of 32 CPUs and 256 GiB, one of them cordoned
    register(api, "n1")
    register(api, "n2")
    client = api.client()
    client.cordon("n2")
    refusals = [
        (spec("big", gpus=8, nodes=1), r"gpus: 8 on one node, but the largest node has 4 \(nodes: n1, n2\)"),
        (spec("cpu", cpus=1000), r"cpus: 1000 on one node, but the largest node has 32 \(nodes: n1, n2\)"),
        (spec("mem", memory="100t"), r"memory: 102400 GiB on one node, but the largest node has 256 GiB"),
        (
            spec("h100", gpus=1, gpu_model="H100"),
            r"gpu_model: no registered node has a GPU \(model ~ 'H100'\)",
        ),
        (spec("gang", gpus=12), r"gpus: 12 GPUs run as 3 members of 4 GPUs .*only 2 registered nodes"),
    ]
    for bad, said in refusals:
        # When a job asks for more than any node has, alone or in a batch
        # Then it is refused, saying how to get it queued anyway, and nothing is queued
        with pytest.raises(SpecError, match=said) as refused:
            client.submit(bad)
        assert "--allow-unplaceable" in str(refused.value)
        with pytest.raises(SpecError, match=r"jobs\[1\]: (?s:.*)" + said):
            client.submit_many([spec("fine"), bad])
        with pytest.raises(SpecError, match=said):
            client.submit_array(bad, "0-3")
    assert client.jobs() == []
    # While what some node could hold is queued: a job of 8 GPUs runs as a gang of two 4-GPU members
    # (the cordoned node counts: it comes back), and the largest node's whole size fits
    fits = [spec("gang8", gpus=8), spec("whole", gpus=4, cpus=32, memory="256g", gpu_model="a100")]
    for job in fits:
        assert client.get(client.submit(job).id).state == JobState.QUEUED
    # And with allow_unplaceable a job is queued for a node not registered yet
    later = client.submit(spec("later", gpus=1, gpu_model="H100", allow_unplaceable=True))
    assert client.get(later.id).state == JobState.QUEUED


def test_the_cli_refuses_it_at_submit_and_its_flag_lets_it_through(api: Api) -> None:
    # Given a fleet of one 4-GPU node
    register(api, "n1")
    # When a user asks for 8 GPUs on one node
    refused = fleet(api, "submit", "--gpus", "8", "--nodes", "1", "--", "sleep", "600")
    # Then the submit fails with a spec error's exit code, naming the field and the way out
    assert refused.returncode == 2, refused.stderr
    assert "gpus: 8 on one node, but the largest node has 4 (nodes: n1)" in refused.stderr
    assert "--allow-unplaceable" in refused.stderr
    assert api.client().jobs() == []
    # And with --allow-unplaceable the job is queued
    kept = fleet(api, "submit", "--gpus", "8", "--nodes", "1", "--allow-unplaceable", "--", "sleep", "600")
    assert kept.returncode == 0, kept.stderr
    (job,) = api.client().jobs()
    assert job.id == kept.stdout.strip() and job.state == JobState.QUEUED and job.spec.allow_unplaceable


def test_a_fleet_with_no_node_registered_yet_accepts_any_job(api: Api) -> None:
    # Given a fleet still coming up: no node has registered
    client = api.client()
    # When jobs of any size are submitted, they are queued (nothing to measure them against)
    for job in (
        spec("big", gpus=64),
        spec("cpu", cpus=1000),
        JobSpec(name="h", command=["true"], gpu_model="H100"),
    ):
        assert client.get(client.submit(job).id).state == JobState.QUEUED
    assert len(client.jobs()) == 3
