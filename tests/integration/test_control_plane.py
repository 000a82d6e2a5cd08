"""The control plane fails and comes back: Redis restarts, controllers die, nodes keep dying."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.procs import DirectClient, FleetProcs
from fleet import Client, JobSpec, JobState
from fleet.ops.local import free_port
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def sleeper(seconds: float, **fields: object) -> JobSpec:
    command = [
        sys.executable,
        "-c",
        f"import time; print('up', flush=True); time.sleep({seconds}); print('done')",
    ]
    return JobSpec.parse({"name": "sleep", "command": command, "gpus": 1, **fields})


class OwnRedis:
    """A redis-server with AOF (fsync always, as config/redis.conf) that a test may SIGKILL and restart."""

    def __init__(self, root: Path) -> None:
        self.port, self.dir = free_port(), root / "redis-data"
        self.dir.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or "redis-server"
        argv = [
            binary,
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        wait_for(lambda: _pings(self.url), timeout=10, what="redis up")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def _pings(url: str) -> bool:
    try:
        with redis.Redis.from_url(url) as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def test_a_redis_restart_loses_nothing_and_disturbs_no_running_job(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    procs = FleetProcs(own_redis.url, tmp_path, "process")
    client = DirectClient(own_redis.url)
    try:
        procs.one_node(client, "t-a", gpus=2)
        running = [client.submit(sleeper(4)) for _ in range(2)]
        queued = client.submit(sleeper(0.5, gpus=2))
        wait_for(lambda: all(h.status().state == JobState.RUNNING for h in running), what="two jobs running")
        # When Redis is SIGKILLed and restarted from its AOF
        own_redis.kill()
        time.sleep(1)
        own_redis.start()
        # Then every job finishes exactly once, the running ones undisturbed
        for h in running:
            status = h.wait(timeout=60)
            assert (status.state, status.attempt, status.infra_requeues) == (JobState.SUCCEEDED, 1, 0), (
                procs.logs()
            )
            assert h.logs() == "up\ndone"
        assert queued.wait(timeout=60).state == JobState.SUCCEEDED
        assert len(client.jobs()) == 3
        # And the services reconnected by themselves, logging the outage once each, not in a storm
        assert client.submit(sleeper(0)).wait(timeout=30).state == JobState.SUCCEEDED
        agent_log = (tmp_path / "t-a.log").read_text()
        assert agent_log.count("heartbeat_failing") == 1 and agent_log.count("heartbeat_recovered") == 1
        assert agent_log.count("Consumer encountered a connection error") <= 1
    finally:
        procs.stop()
        client.close()


def test_a_dead_leader_hands_over_and_scheduling_continues(procs: FleetProcs, client: Client) -> None:
    leader = procs.controller("c1")
    wait_for(lambda: "leadership_acquired" in (procs.root / "c1.log").read_text(), what="c1 leads")
    procs.controller("c2")
    procs.agent("t-a", gpus=1)
    procs.wait_nodes(client, 1)
    assert client.submit(sleeper(0)).wait(timeout=30).state == JobState.SUCCEEDED
    # When the leader is SIGKILLed
    leader.send_signal(signal.SIGKILL)
    leader.wait()
    killed = time.monotonic()
    job = client.submit(sleeper(0))
    # Then the other controller takes over within about one lease period (2s here) and places it
    assert job.wait(timeout=30).state == JobState.SUCCEEDED
    assert time.monotonic() - killed < 2 * 2 + 2
    assert "leadership_acquired" in (procs.root / "c2.log").read_text()


def test_a_restarted_lone_controller_reconciles_from_state(procs: FleetProcs, client: Client) -> None:
    first = procs.controller("c1")
    procs.agent("t-a", gpus=1)
    procs.wait_nodes(client, 1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    # Jobs submitted while no controller runs wait, and are placed once one starts
    jobs = [client.submit(sleeper(0)) for _ in range(3)]
    time.sleep(1)
    assert {h.status().state for h in jobs} == {JobState.QUEUED}
    procs.controller("c1-again")
    assert [h.wait(timeout=60).state for h in jobs] == [JobState.SUCCEEDED] * 3


def test_infrastructure_requeues_are_capped(procs: FleetProcs, client: Client) -> None:
    procs.env["FLEET_MAX_INFRA_REQUEUES"] = "1"
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(sleeper(300))
    wait_for(lambda: job.status().state == JobState.RUNNING, what="running on t-a")
    procs.agent("t-b", gpus=1)
    procs.wait_nodes(client, 2)
    procs.kill_node("t-a")
    wait_for(
        lambda: (job.status().node, job.status().state) == ("t-b", JobState.RUNNING), what="rerun on t-b"
    )
    # When the node it moved to dies too
    procs.kill_node("t-b")
    status = job.wait(timeout=60)
    # Then the job stops bouncing: FAILED, with the cap in the reason, its retry budget untouched
    assert status.state == JobState.FAILED and status.failures == 0 and status.infra_requeues == 1
    assert status.reason == "node t-b down (lease expired); infrastructure requeue cap (1) reached"
