"""Multi-node jobs through real agents (process runtime, simulated GPUs): one member per node with
torchrun's variables, placed whole, stopped together, restarted whole."""

from __future__ import annotations

import time

import pytest

from fleet import Client, JobSpec, JobState
from tests.conftest import FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration
HERE = {"FLEET_AGENT__ADDRESS": "127.0.0.1"}  # every node on this machine
SHOW_ENV = (
    'echo "rank=$FLEET_NODE_RANK of=$FLEET_NUM_NODES gpus=$FLEET_NUM_GPUS '
    'master=$MASTER_ADDR:$MASTER_PORT world=$WORLD_SIZE node_rank=$NODE_RANK"'
)
#: sleeps in attempt 1 (until stopped), ends at once in later ones saying which attempt and rank
FIRST_ATTEMPT_HANGS = (
    'if [ "$FLEET_ATTEMPT" = 1 ]; then sleep 300; fi; echo "attempt $FLEET_ATTEMPT rank $FLEET_NODE_RANK"'
)


@pytest.fixture
def runtime() -> str:
    return "process"


def sh(script: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": "gang", "command": ["sh", "-c", script], **fields})


def fleet_of(procs: FleetProcs, client: Client, nodes: int, gpus: int = 2) -> list[str]:
    procs.controller()
    names = [f"t-g{i}" for i in range(nodes)]
    for name in names:
        procs.agent(name, gpus=gpus, **HERE)
    procs.wait_nodes(client, nodes)
    return names


def test_a_job_larger_than_a_node_runs_one_member_per_node_with_torchrun_variables(
    procs: FleetProcs, client: Client
) -> None:
    # Given two nodes of 2 GPUs
    fleet_of(procs, client, 2)
    # When a 4-GPU job is submitted
    job = client.submit(sh(SHOW_ENV, gpus=4))
    status = job.wait(timeout=60)
    # Then it ran as two members of 2 GPUs, one per node, and succeeded once both ended
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert sorted(m.node for m in status.members) == ["t-g0", "t-g1"]
    assert [len(m.gpus) for m in status.members] == [2, 2] and status.attempt == 1
    # And each member saw its rank, the world and where rank 0 listens
    port = status.master_port
    assert port >= 29400
    for rank in (0, 1):  # each member's output is its own stream (fleet logs JOB --rank N)
        assert (
            job.logs(rank=rank) == f"rank={rank} of=2 gpus=2 master=127.0.0.1:{port} world=2 node_rank={rank}"
        )
    # And every GPU is free again
    assert all(n.claims == {} for n in client.nodes())


def test_one_member_failing_stops_the_others_at_once_and_the_job_restarts_whole(
    procs: FleetProcs, client: Client
) -> None:
    fleet_of(procs, client, 2)
    # Given a 2-node job whose rank 1 fails after a second in its first attempt, rank 0 sleeping on
    script = (
        'if [ "$FLEET_ATTEMPT" = 1 ]; then if [ "$FLEET_NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; '
        'sleep 300; fi; echo "attempt $FLEET_ATTEMPT rank $FLEET_NODE_RANK"'
    )
    started = time.monotonic()
    job = client.submit(sh(script, nodes=2, gpus=2))
    status = job.wait(timeout=90)
    # Then rank 0 was stopped within seconds (not after its sleep), and the second attempt ran whole
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert time.monotonic() - started < 60
    assert status.attempt == 2 and status.failures == 1  # a member's own failure spends one retry
    reasons = [e.reason for e in job.history() if e.attempt == 1]
    assert any(r.startswith("member 1 on t-g") and "code 3" in r for r in reasons), reasons
    assert [job.logs(rank=r) for r in (0, 1)] == ["attempt 2 rank 0", "attempt 2 rank 1"]


def test_every_member_failing_at_once_is_the_jobs_failure_decided_without_waiting_for_a_node(
    procs: FleetProcs, client: Client
) -> None:
    fleet_of(procs, client, 2)
    # Given a 2-node job whose members both fail after a second in the first attempt
    script = 'if [ "$FLEET_ATTEMPT" = 1 ]; then sleep 1; exit 3; fi; echo "attempt $FLEET_ATTEMPT"'
    job = client.submit(sh(script, nodes=2, gpus=2))
    status = job.wait(timeout=90)
    # Then the attempt ended as the job's own failure as soon as both had said so (no peer's node
    # to wait for: both were alive to record their failure), one retry spent, and the job ran again
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert status.attempt == 2 and status.failures == 1
    reasons = [e.reason for e in job.history() if e.attempt == 1]
    assert any("code 3 (every member failed)" in r for r in reasons), reasons


def test_a_members_node_dying_requeues_the_whole_job_onto_the_nodes_left(
    procs: FleetProcs, client: Client
) -> None:
    fleet_of(procs, client, 3)
    # Given a 2-node job running (its first attempt sleeps; later ones end at once)
    job = client.submit(sh(FIRST_ATTEMPT_HANGS, nodes=2, gpus=4))
    wait_for(lambda: client.get(job.id).state == JobState.RUNNING, timeout=30)
    first = client.get(job.id)
    lost = first.members[1].node
    # When the node of rank 1 loses power
    procs.kill_node(lost)
    # Then the whole job is requeued (not the job's fault) and runs again on the two nodes left
    status = job.wait(timeout=90)
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert status.attempt == 2 and status.failures == 0 and status.infra_requeues == 1
    assert lost not in {m.node for m in status.members}
    assert [job.logs(rank=r) for r in (0, 1)] == ["attempt 2 rank 0", "attempt 2 rank 1"]
    # And the surviving member of the first attempt is gone from its node
    survivor = first.members[0].node
    wait_for(lambda: not list((procs.root / survivor / "attempts").glob(f"{job.id}.1")), timeout=30)


def test_two_gangs_and_a_stream_of_small_jobs_share_a_fleet_that_fits_one_gang_at_a_time(
    procs: FleetProcs, client: Client
) -> None:
    # Given two nodes of 2 GPUs, two 2-node gangs wanting all four GPUs, and 1-GPU jobs besides
    fleet_of(procs, client, 2)
    gangs = [client.submit(sh("sleep 1", nodes=2, gpus=4, name=f"gang{i}")) for i in range(2)]
    small = [client.submit(sh("sleep 0.2", gpus=1, name=f"small{i}")) for i in range(6)]
    # Then everything finishes, no deadlock
    for handle in [*gangs, *small]:
        assert handle.wait(timeout=120).state == JobState.SUCCEEDED, procs.logs()
    # And a gang was never placed in part: each ran once, both members together, alone on the fleet
    spans = []
    for handle in gangs:
        events = handle.history()
        assert [e.state for e in events].count("RUNNING") == 1 and client.get(handle.id).attempt == 1
        start = next(e.at for e in events if e.state == "RUNNING")
        spans.append((start, next(e.at for e in events if e.state == "SUCCEEDED")))
    assert spans[0][1] <= spans[1][0] or spans[1][1] <= spans[0][0], spans  # one gang at a time


def test_draining_one_members_node_moves_the_whole_job_without_spending_a_retry(
    procs: FleetProcs, client: Client
) -> None:
    fleet_of(procs, client, 3)
    job = client.submit(sh(FIRST_ATTEMPT_HANGS, nodes=2, gpus=4))
    wait_for(lambda: client.get(job.id).state == JobState.RUNNING, timeout=30)
    drained = client.get(job.id).members[1].node
    # When an operator drains rank 1's node with no time to finish
    client.drain([drained], deadline_s=0, grace_s=2)
    # Then both members stop, and the job runs again whole on the other two nodes, its retries unspent
    status = job.wait(timeout=90)
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert status.attempt == 2 and status.failures == 0
    assert drained not in {m.node for m in status.members}
