"""A node supervisor outlives agent restarts, not its agent: once it holds no attempt and no agent
has been connected for ``agent.supervisor_idle_exit_s`` it exits, and SIGTERM ends an idle one. While
it holds an attempt it stays, SIGTERM or not, and the job runs on."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState
from tests.conftest import FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphaned supervisor is reaped by init, whenever that runs)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def supervisor_of(procs: FleetProcs, node: str) -> tuple[int, Path]:
    state = procs.root / node
    return int((state / "supervisor.pid").read_text()), state / "supervisor.log"


def kill_agent(procs: FleetProcs, node: str) -> None:
    procs.procs[node].send_signal(signal.SIGKILL)
    procs.procs[node].wait()


def test_a_supervisor_whose_agent_is_gone_and_that_holds_nothing_exits(
    procs: FleetProcs, client: Client
) -> None:
    # Given two nodes with no jobs: t-i's supervisor waits 1 s idle, t-t's 10 minutes
    procs.agent("t-i", gpus=1, FLEET_AGENT__SUPERVISOR_IDLE_EXIT_S="1")
    procs.agent("t-t", gpus=1, FLEET_AGENT__SUPERVISOR_IDLE_EXIT_S="600")
    procs.wait_nodes(client, 2)
    (idle, idle_log), (termed, termed_log) = supervisor_of(procs, "t-i"), supervisor_of(procs, "t-t")
    assert running(idle) and running(termed)
    # When both agents are SIGKILLed (an uninstalled node, a test's temporary fleet)
    kill_agent(procs, "t-i")
    kill_agent(procs, "t-t")
    # Then t-i's supervisor exits by itself, saying why, and removes its socket and pid file
    wait_for(lambda: not running(idle), 30, "the idle supervisor exiting", procs)
    assert "exit reason=idle" in idle_log.read_text()
    assert not (procs.root / "t-i" / "supervisor.sock").exists()
    assert not (procs.root / "t-i" / "supervisor.pid").exists()
    # And t-t's, idle but told to wait longer, exits on SIGTERM
    assert running(termed)
    os.kill(termed, signal.SIGTERM)
    wait_for(lambda: not running(termed), 30, "the supervisor exiting on SIGTERM", procs)
    assert "exit reason=SIGTERM" in termed_log.read_text()


def test_a_supervisor_holding_a_job_stays_without_its_agent_and_the_job_runs_on(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given a job running on t-s, whose lease outlasts the test (no fencing while its agent is gone)
    go = tmp_path / "go"
    env = {"FLEET_AGENT__SUPERVISOR_IDLE_EXIT_S": "0.5", "FLEET_AGENT__NODE_LEASE_TTL_S": "120"}
    procs.one_node(client, "t-s", gpus=1, **env)
    job = client.submit(
        JobSpec(name="hold", command=["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"])
    )
    wait_for(lambda: client.get(job.id).state == JobState.RUNNING, 30, "the job running", procs)
    pid, log = supervisor_of(procs, "t-s")
    # When its agent is SIGKILLed and its supervisor gets SIGTERM
    kill_agent(procs, "t-s")
    os.kill(pid, signal.SIGTERM)
    # Then the supervisor says it keeps the attempt, and stays past its idle timeout many times over
    wait_for(lambda: "sigterm_ignored attempts=1" in log.read_text(), 30, "the SIGTERM answered", procs)
    time.sleep(3)
    assert running(pid) and "exit reason" not in log.read_text()
    # And once the agent is back, the same supervisor still holds the job, which runs to its end
    procs.agent("t-s", gpus=1, **env)
    agent_log = procs.root / "t-s.log"
    wait_for(lambda: "attempt_reattached" in agent_log.read_text(), 30, "the attempt reattached", procs)
    go.touch()
    assert job.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    assert client.get(job.id).attempt == 1 and supervisor_of(procs, "t-s")[0] == pid
    # And with nothing left to hold and its agent gone again, it exits
    kill_agent(procs, "t-s")
    wait_for(lambda: not running(pid), 30, "the supervisor exiting once idle", procs)
