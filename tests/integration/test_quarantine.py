"""One unreadable record is set aside with its reason; the rest of the fleet keeps scheduling."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis as redis_py

from fleet import Client, JobSpec, JobState
from fleet.keys import Keys
from tests.conftest import FleetProcs

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def fleet_cli(procs: FleetProcs, *args: str) -> subprocess.CompletedProcess[str]:
    env = procs.cli_env()
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_unreadable_job_and_node_records_are_quarantined_and_the_rest_runs(
    procs: FleetProcs, client: Client, redis: redis_py.Redis
) -> None:
    keys = Keys()
    # Given three good jobs, one whose spec is not JSON and one in a state fleet does not know,
    # queued next to each other, and a node record with an unknown admin state
    good = [client.submit(JobSpec(name=f"good{i}", command=["true"], gpus=1)) for i in range(3)]
    bad_spec = client.submit(JobSpec(name="badspec", command=["true"]), job_id="bad-spec")
    client.submit(JobSpec(name="badstate", command=["true"]), job_id="bad-state")
    redis.hset(keys.job("bad-spec"), "spec", "{not json")
    redis.hset(keys.job("bad-state"), "state", "PAUSED")
    redis.hset(keys.node("t-bad"), mapping={"name": "t-bad", "state": "MAINTENANCE", "gpus": "[]"})
    redis.sadd(keys.nodes, "t-bad")
    # When a controller and an agent start
    procs.controller()
    procs.agent("t-a", gpus=2)
    # Then the good jobs run, on the good node
    for handle in good:
        assert handle.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    assert [n.name for n in client.nodes()] == ["t-a"]
    # And the bad ones are out of the queue and every state set, set aside with their reasons
    quarantined = redis.hgetall(keys.quarantined_jobs)
    assert quarantined == {
        "bad-spec": "spec: Invalid JSON: key must be a string at line 1 column 2",
        "bad-state": "state: 'PAUSED' is not a valid JobState",
    }
    assert redis.hgetall(keys.quarantined_nodes) == {"t-bad": "state: 'MAINTENANCE' is not a valid NodeState"}
    assert redis.zrange(keys.queued, 0, -1) == []
    assert not any(redis.sismember(keys.jobs_in(s), j) for s in JobState for j in ("bad-spec", "bad-state"))
    # And `fleet show` says the job is quarantined and why (exit code 7), as does `fleet nodes show`
    shown = fleet_cli(procs, "show", bad_spec.id)
    assert (shown.returncode, shown.stderr) == (
        7,
        f"fleet: job bad-spec is quarantined: {quarantined['bad-spec']}\n",
    )
    node = fleet_cli(procs, "nodes", "show", "t-bad")
    assert node.returncode == 7 and "node t-bad is quarantined: state: 'MAINTENANCE'" in node.stderr
    listed = fleet_cli(procs, "jobs")
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [h.id for h in reversed(good)]
    assert "2 job record(s) unreadable and quarantined, not listed: bad-spec, bad-state" in listed.stderr
    # And the controller logged each quarantine once, though its passes kept finding the node record
    time.sleep(1.5)
    log = (procs.root / "controller.log").read_text()
    quarantine_lines = [line for line in log.splitlines() if "record_quarantined" in line]
    assert sorted(line.split("id=")[1].split()[0] for line in quarantine_lines) == [
        "bad-spec",
        "bad-state",
        "t-bad",
    ]
    assert "crashed" not in log and "failing" not in log
