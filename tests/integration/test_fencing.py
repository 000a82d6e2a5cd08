"""An attempt is fenced even when its agent is gone: the node supervisor stops it before the lease
can expire, so the controller never starts the job elsewhere while it still runs here.

Both runtimes; the job writes the host's uptime (one clock for every process and container on the
machine) into its checkpoint directory, so the test sees exactly when each attempt ran.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import pytest

from bench.procs import FleetProcs, kill_supervisor
from fleet import Client, JobSpec, JobState
from tests.support import wait_for

pytestmark = pytest.mark.integration


def ticker(count: str) -> str:
    """A job that writes the host's uptime into its checkpoint directory ``count`` times, 50 ms apart."""
    return (
        f"for i in $(seq {count}); do "
        'cut -d" " -f1 /proc/uptime >> "$FLEET_CHECKPOINT_DIR/ticks-$FLEET_ATTEMPT"; sleep 0.05; done'
    )


TICKER = ticker("120")
#: the same, but the first attempt ticks for minutes: it is still running when its agent dies however
#: slowly the machine starts a second node (else it may end on its own, and there is nothing to fence)
FIRST_TICKS_LONG = ticker('$([ "$FLEET_ATTEMPT" = 1 ] && echo 6000 || echo 120)')


def ticks(ckpt: Path, attempt: int) -> list[float]:
    try:
        return [float(t) for t in (ckpt / f"ticks-{attempt}").read_text().split()]
    except FileNotFoundError:
        return []


def test_a_killed_agent_never_leaves_its_attempt_running_past_the_lease(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    # Given a job running on t-a, and a second node t-b
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(JobSpec(name="tick", gpus=1, command=["sh", "-c", FIRST_TICKS_LONG]))
    ckpt = procs.root / "checkpoints" / job.id
    wait_for(lambda: len(ticks(ckpt, 1)) > 5, 30, "attempt 1 ticking")
    procs.agent("t-b", gpus=1)
    procs.wait_nodes(client, 2)
    # When t-a's agent is SIGKILLed and not restarted (its supervisor and the job stay up)
    procs.procs["t-a"].send_signal(signal.SIGKILL)
    procs.procs["t-a"].wait()
    status = job.wait(timeout=90)
    # Then the job ran again on t-b, and attempt 1's last line came before attempt 2's first
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.node, status.attempt, status.failures) == ("t-b", 2, 0)
    first, second = ticks(ckpt, 1), ticks(ckpt, 2)
    assert len(second) == 120 and max(first) < min(second), (max(first), min(second))
    # And the supervisor on t-a says it fenced the attempt; its requeue spent no retry
    assert "fenced attempts=1" in (procs.root / "t-a" / "supervisor.log").read_text()
    assert any("node t-a down" in e.reason for e in client.history(job.id))


def test_a_supervisor_that_dies_takes_its_process_jobs_with_it(procs: FleetProcs, client: Client) -> None:
    if procs.runtime != "process":
        pytest.skip("process runtime: Docker containers are not the supervisor's children")
    # Given a running process-runtime job
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(JobSpec(name="tick", gpus=1, command=["sh", "-c", TICKER]))
    ckpt = procs.root / "checkpoints" / job.id
    wait_for(lambda: len(ticks(ckpt, 1)) > 5, 30, "attempt 1 ticking")
    # When the node's supervisor is SIGKILLed
    kill_supervisor(procs.root / "t-a")
    # Then the job stops ticking at once (never orphaned), and the agent requeues it with a new supervisor
    time.sleep(0.5)
    count = len(ticks(ckpt, 1))
    time.sleep(0.5)
    assert len(ticks(ckpt, 1)) == count
    status = job.wait(timeout=60)
    assert status.state == JobState.SUCCEEDED and status.attempt == 2 and status.failures == 0, procs.logs()


WAIT_FOR_GO = 'while [ ! -e "$FLEET_CHECKPOINT_DIR/go" ]; do sleep 0.05; done; echo done'


def test_an_exit_the_agent_could_not_record_is_never_taken_for_a_lost_attempt(
    procs: FleetProcs, client: Client, redis_url: str
) -> None:
    from tests.integration.test_dependability import CuttableProxy

    proxy = CuttableProxy(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    try:
        # Given a job running on an agent whose Redis connection can be cut
        procs.one_node(client, "t-a", gpus=1, FLEET_REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0")
        job = client.submit(JobSpec(name="once", gpus=1, command=["sh", "-c", WAIT_FOR_GO]))
        wait_for(lambda: job.status().state == JobState.RUNNING, 30, "running")
        # When the job exits successfully while its agent cannot reach Redis (shorter than the lease)
        proxy.cut()
        (procs.root / "checkpoints" / job.id / "go").touch()
        time.sleep(1.0)
        proxy.heal()
        status = job.wait(timeout=60)
        # Then the exit is recorded once Redis is back: SUCCEEDED on the first attempt, not run again
        assert (status.state, status.attempt, status.infra_requeues) == (JobState.SUCCEEDED, 1, 0), (
            procs.logs()
        )
        assert "exit_not_recorded" in (procs.root / "t-a.log").read_text()
    finally:
        proxy.close()


class HangingRegistry:
    """A registry on this machine that accepts connections and never answers: a pull that hangs."""

    def __init__(self) -> None:
        import socket
        import threading

        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        import socket

        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()


@pytest.mark.docker
def test_a_pull_that_hangs_never_delays_the_heartbeat(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    if runtime != "docker":
        pytest.skip("docker only: the process runtime pulls nothing")
    registry = HangingRegistry()
    try:
        # Given a node running a job, and pulls allowed
        procs.one_node(client, "t-a", gpus=2, FLEET_AGENT__DOCKER_PULL="missing")
        running = client.submit(JobSpec(name="tick", gpus=1, command=["sh", "-c", TICKER]))
        ckpt = procs.root / "checkpoints" / running.id
        wait_for(lambda: len(ticks(ckpt, 1)) > 5, 30, "job ticking")
        # When another job's image pull hangs for longer than the node lease (3 s)
        image = f"127.0.0.1:{registry.port}/hangs:latest"
        stuck = client.submit(JobSpec(name="pull", gpus=1, image=image, command=["true"]))
        wait_for(lambda: stuck.status().state == JobState.STARTING, 30, "pull started")
        time.sleep(5)
        # Then the node stayed up, the running job was never fenced, and it finishes on attempt 1
        assert all(n.alive for n in client.nodes())
        assert running.wait(timeout=60).state == JobState.SUCCEEDED
        assert running.status().attempt == 1
        assert "fenced" not in (procs.root / "t-a" / "supervisor.log").read_text()
        client.cancel(stuck.id)
    finally:
        registry.close()
