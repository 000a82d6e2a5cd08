"""A real torch DistributedDataParallel job as a 2-node gang through fleet: two agents on this
machine act as two nodes (process runtime, gloo on CPU), torchrun started by each member."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState
from tests.conftest import FleetProcs, need_torch
from tests.integration.test_gangs import fleet_of
from tests.workers.test_ddp import BATCH, EVERY, EXAMPLE, STEPS, final_weights

pytestmark = pytest.mark.integration
TORCHRUN = (
    'exec "$PY" -m torch.distributed.run --nnodes "$FLEET_NUM_NODES" '
    '--node-rank "$FLEET_NODE_RANK" --nproc-per-node 1 --master-addr "$MASTER_ADDR" '
    '--master-port "$MASTER_PORT" "$EXAMPLE" "$@"'
)


@pytest.fixture
def runtime() -> str:
    need_torch()
    return "process"


def ddp(*args: str, **fields: object) -> JobSpec:
    """The README's torchrun command, this interpreter's torch; a 30 s collective timeout: the
    members' rendezvous waits that long for the slower one (importing torch can take many seconds
    on a busy machine), and a member whose peer's node died waits that long for fleet, which stops
    it within the node lease (3 s here). At 5 s either could fail first: a retry spent."""
    command = [
        "sh",
        "-c",
        TORCHRUN,
        "ddp",
        "--steps",
        str(STEPS),
        "--every",
        str(EVERY),
        "--global-batch",
        str(BATCH),
        "--dist-timeout",
        "30",
        *args,
    ]
    env = {"PY": sys.executable, "EXAMPLE": str(EXAMPLE)}
    return JobSpec.parse({"name": "ddp", "command": command, "env": env, "nodes": 2, **fields})


def steps(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"^step (\d+) loss", text, re.MULTILINE)]


def assert_trains_what_one_process_trains(checkpoint_dir: Path, one_process: tuple[str, Path]) -> None:
    """Final weights within 1e-5 of one plain process on the same global batch (why 1e-5:
    tests/workers/test_ddp.py, test_a_two_member_gang_trains_what_one_process_trains)."""
    import torch

    expected, actual = final_weights(one_process[1]), final_weights(checkpoint_dir)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.timeout(300)  # its own waits allow this long on a slow machine, the suite's 120 s guard not
def test_a_two_node_ddp_job_trains_what_one_process_trains(
    procs: FleetProcs, client: Client, one_process: tuple[str, Path]
) -> None:
    # Given two nodes of 2 GPUs and a DDP job of 2 GPUs on 2 nodes (one torchrun per node)
    fleet_of(procs, client, 2)
    job = client.submit(ddp(gpus=2))
    # Then it succeeds, each member joined as its node's rank in a world of two
    status = job.wait(timeout=180)
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert "rank 0 of 2 local_rank 0 node 0 of 2 attempt 1" in job.logs(rank=0)
    assert "rank 1 of 2 local_rank 0 node 1 of 2 attempt 1" in job.logs(rank=1)
    assert steps(job.logs(rank=0)) == list(range(1, STEPS + 1))  # rank 0 logs every step
    # And the model is what one process trains on the same global batch
    assert_trains_what_one_process_trains(procs.root / "checkpoints" / job.id, one_process)


@pytest.mark.timeout(300)  # its own waits allow this long on a slow machine, the suite's 120 s guard not
def test_killing_a_members_node_resumes_the_gang_from_its_checkpoint_without_repeating_a_step(
    procs: FleetProcs, client: Client, one_process: tuple[str, Path]
) -> None:
    # Given three nodes and the DDP job on two of them, 50 ms a step
    fleet_of(procs, client, 3)
    job = client.submit(ddp("--sleep", "0.05", gpus=2))
    deadline = time.monotonic() + 120
    while max(steps(job.logs(rank=0)), default=0) < 3 * EVERY:
        assert time.monotonic() < deadline, procs.logs()
        time.sleep(0.2)
    # When the node of rank 1 loses power mid-run
    procs.kill_node(client.get(job.id).members[1].node)
    # Then the whole job runs again on the two nodes left (not its fault: no retry spent)
    status = job.wait(timeout=180)
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.attempt, status.failures, status.infra_requeues) == (2, 0, 1)
    # And attempt 2 resumed from a checkpoint of attempt 1, and ran only the steps after it
    second = job.logs(attempt=2, rank=0)
    resumed = re.search(r"rank 0 resumed from step (\d+) \(attempt 2\)", second)
    assert resumed, second
    assert int(resumed.group(1)) >= 3 * EVERY
    assert steps(second) == list(range(int(resumed.group(1)) + 1, STEPS + 1))
    # And the model is still what one process trains
    assert_trains_what_one_process_trains(procs.root / "checkpoints" / job.id, one_process)
