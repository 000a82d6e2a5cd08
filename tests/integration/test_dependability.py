"""Every failure requeues the job, which resumes from its last checkpoint: nothing lost, nothing twice.

Real agents and controllers as processes, real SIGKILLs, the process runtime. A crash runs the torch
example, which resumes bit-for-bit (so "resumed correctly" is checked on the final weights); the
other failures run its torch-free stand-in (tests/fixtures/steps.py), whose digest chain is checked
the same way without importing torch in every attempt.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import LASTING_LEASE
from fleet import Client, JobSpec, JobState
from fleet.agent import checkpoints
from fleet.bus import CONTROLLER_QUEUE, AttemptUpdate, Bus, Launch, node_queue
from tests.conftest import FleetProcs, need, need_torch
from tests.support import wait_for

pytestmark = pytest.mark.integration
EXAMPLE = str(Path(__file__).resolve().parents[2] / "workers" / "examples" / "train_regression.py")
#: the example's torch-free stand-in: same flags, same lines (``--resumed-sleep``: its own)
STEPS = str(Path(__file__).resolve().parents[1] / "fixtures" / "steps.py")


@pytest.fixture
def runtime() -> str:
    need_torch()
    return "process"


def train(*args: str, script: str = EXAMPLE, **fields: object) -> JobSpec:
    """120 steps of ``script`` (the torch example; ``STEPS``: its stand-in), checkpointing every 10."""
    command = [sys.executable, script, "--steps", "120", "--every", "10", *args]
    return JobSpec.parse({"name": "train", "command": command, "gpus": 1, **fields})


def uninterrupted_digest(tmp: Path, script: str = EXAMPLE) -> str:
    env = {**os.environ, "FLEET_CHECKPOINT_DIR": str(tmp / "reference")}
    out = subprocess.run(
        [sys.executable, script, "--steps", "120", "--every", "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return digest(out)


def digest(text: str) -> str:
    found = re.search(r"weights ([0-9a-f]{64})", text)
    assert found, text
    return found.group(1)


def progress(client: Client, job_id: str, attempt: int) -> list[int]:
    lines = [line.line for line in client.logs(job_id, attempt)]
    return [json.loads(line.split(" ", 1)[1])["step"] for line in lines if line.startswith("fleet-progress")]


def test_a_crash_requeues_with_backoff_and_resumes_from_the_checkpoint(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    procs.one_node(client, "t-a", gpus=1)
    # Given a training job whose first attempt crashes at step 55 (last checkpoint: 50)
    job = client.submit(train("--fail-at", "55"))
    status = job.wait(timeout=120)
    # Then attempt 2 resumed from step 50, spent one retry, and ended with the uninterrupted weights
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.attempt, status.failures, status.infra_requeues) == (2, 1, 0)
    assert "resumed from step 50 (attempt 2)" in job.logs(attempt=2)
    assert progress(client, job.id, 2)[0] == 60
    requeued = [e for e in job.history() if e.state == "QUEUED" and e.attempt == 1]
    assert requeued[0].reason == "exited with code 1; retry 2 of 3 in 0.5s"
    assert digest(job.logs()) == uninterrupted_digest(tmp_path)
    assert status.checkpoint == "step-0000000120.ckpt"


def test_node_death_moves_the_job_to_another_node_without_spending_retries(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(train("--sleep", "0.05", "--resumed-sleep", "0", script=STEPS))
    wait_for(lambda: max(progress(client, job.id, 1), default=0) >= 30, what="30 steps on t-a")
    procs.agent("t-b", gpus=1)
    procs.wait_nodes(client, 2)
    # When node t-a loses power
    killed_at = time.monotonic()
    procs.kill_node("t-a")
    wait_for(
        lambda: job.status().node == "t-b" and job.status().state == JobState.RUNNING, what="rerun on t-b"
    )
    detected_in = time.monotonic() - killed_at
    status = job.wait(timeout=120)
    # Then the job ran again on t-b from its checkpoint, and its retry budget is intact
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.node, status.attempt, status.failures, status.infra_requeues) == ("t-b", 2, 0, 1)
    resumed = int(re.search(r"resumed from step (\d+)", job.logs(attempt=2)).group(1))  # type: ignore[union-attr]
    assert resumed >= 30
    lost = [e for e in job.history() if e.state == "QUEUED" and e.attempt == 1]
    assert lost[0].reason == "node t-a down (lease expired); requeued (retry budget not spent)"
    assert digest(job.logs()) == uninterrupted_digest(tmp_path, STEPS)
    assert detected_in < 3 + 2 + 5  # lease TTL 3s + a reconcile pass + start; a bound, not a benchmark
    assert max(progress(client, job.id, 1)) >= 30  # attempt 1's logs outlive its node
    assert client.nodes()[0].name == "t-a" and not client.nodes()[0].alive


def test_an_agent_restart_reattaches_without_requeue(procs: FleetProcs, client: Client) -> None:
    procs.one_node(client, "t-a", gpus=1, **LASTING_LEASE)
    # 200 ms a step: the 100 steps left outlast a restarted agent's start on a slow, busy machine (at 50 ms,
    # the job could end before the new agent was up, and there was nothing to reattach)
    job = client.submit(train("--sleep", "0.2", script=STEPS))
    wait_for(lambda: max(progress(client, job.id, 1), default=0) >= 20, what="20 steps")
    # When the agent alone is SIGKILLed (its jobs keep running) and restarted within the lease TTL
    procs.procs["t-a"].send_signal(signal.SIGKILL)
    procs.procs["t-a"].wait()
    procs.agent("t-a", gpus=1, **LASTING_LEASE)
    status = job.wait(timeout=120)
    # Then the same attempt finished: no requeue, one process (steps never repeat), logs complete
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert status.attempt == 1 and status.infra_requeues == 0
    assert [e.state for e in job.history()] == ["QUEUED", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert progress(client, job.id, 1) == list(range(10, 121, 10))
    assert "resumed" not in job.logs() and "final loss" in job.logs()
    assert "attempt_reattached" in (procs.root / "t-a.log").read_text()


def test_stale_and_duplicate_messages_change_nothing(procs: FleetProcs, client: Client) -> None:
    procs.one_node(client, "t-a", gpus=1)
    job = client.submit(train("--sleep", "0.03", "--fail-at", "15", script=STEPS))
    wait_for(lambda: job.status().attempt == 2 and job.status().state == JobState.RUNNING, what="attempt 2")
    status = job.status()
    bus = Bus(procs.settings())
    # When a duplicated launch of attempt 2, a stale launch of attempt 1 and a stale exit of attempt 1 arrive
    for attempt in (2, 2, 1):
        bus.send(node_queue("t-a"), Launch(job_id=job.id, attempt=attempt, gpus=status.gpus))
    bus.send(
        CONTROLLER_QUEUE, AttemptUpdate(job_id=job.id, attempt=1, node="t-a", phase="exited", exit_code=1)
    )
    final = job.wait(timeout=120)
    bus.close()
    # Then attempt 2 ran once and finished normally
    assert final.state == JobState.SUCCEEDED and final.attempt == 2 and final.failures == 1
    assert job.logs(attempt=2).count("resumed from step 10") == 1
    assert progress(client, job.id, 2) == list(range(20, 121, 10))
    assert "launch_ignored" in (procs.root / "t-a.log").read_text()


class CuttableProxy:
    """A TCP proxy to Redis for one agent; ``cut()`` drops every connection and refuses new ones."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.close()

    def cut(self) -> None:
        self.open = False
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.conns.clear()

    def heal(self) -> None:
        self.open = True

    def close(self) -> None:
        """Drop every connection and stop accepting: a shutdown wakes the thread blocked in
        ``accept`` (closing the socket alone would leave it there, with the socket)."""
        self.cut()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[CuttableProxy]:
    p = CuttableProxy(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    yield p
    p.close()


#: a tick a line, 50 ms apart in attempt 1 (long enough to be cut off mid-run), 5 ms after
TICKER = (
    "import os, time\n"
    "path = os.path.join(os.environ['TICKS'], 'attempt-' + os.environ['FLEET_ATTEMPT'])\n"
    "pause = 0.05 if os.environ['FLEET_ATTEMPT'] == '1' else 0.005\n"
    "for _ in range(int(os.environ['N'])):\n"
    "    with open(path, 'a') as f: f.write(repr(time.time()) + '\\n')\n"
    "    time.sleep(pause)\n"
)


def test_a_partitioned_agent_fences_itself_and_no_attempts_overlap(
    procs: FleetProcs, client: Client, proxy: CuttableProxy, tmp_path: Path
) -> None:
    procs.one_node(client, "t-a", gpus=1, FLEET_REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0")
    ticks = tmp_path / "ticks"
    ticks.mkdir(mode=0o777)
    ticks.chmod(0o777)  # the job runs as the unprivileged job user
    job = client.submit(
        JobSpec(
            name="tick", gpus=1, command=[sys.executable, "-c", TICKER], env={"TICKS": str(ticks), "N": "200"}
        )
    )
    wait_for(lambda: (ticks / "attempt-1").exists(), what="attempt 1 ticking")
    procs.agent("t-b", gpus=1)
    procs.wait_nodes(client, 2)
    # When t-a loses Redis while Redis stays up for everyone else
    proxy.cut()
    status = job.wait(timeout=120)
    # Then the job finished on t-b, and attempt 1 had stopped before attempt 2 started
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert (status.node, status.attempt, status.failures) == ("t-b", 2, 0)
    first = [float(t) for t in (ticks / "attempt-1").read_text().split()]
    second = [float(t) for t in (ticks / "attempt-2").read_text().split()]
    assert len(second) == 200 and max(first) < min(second)
    assert "fenced attempts=1" in (procs.root / "t-a" / "supervisor.log").read_text()
    # And when the partition heals, t-a rejoins
    proxy.heal()
    wait_for(lambda: all(n.alive for n in client.nodes()), what="t-a rejoined")
    assert {n.name: n.state.value for n in client.nodes()} == {"t-a": "READY", "t-b": "READY"}


def test_a_container_crash_resumes_in_a_new_container_from_the_checkpoint(
    docker_procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    import docker

    try:
        docker.from_env().images.get("localhost/fleet/torch:latest")
    except docker.errors.ImageNotFound:
        need(False, "localhost/fleet/torch image missing (make images-test)")
    docker_procs.controller()
    docker_procs.agent("t-dock", gpus=1)
    docker_procs.wait_nodes(client, 1)
    command = [
        "python3",
        "/opt/fleet/examples/train_regression.py",
        "--steps",
        "120",
        "--every",
        "10",
        "--fail-at",
        "55",
    ]
    job = client.submit(JobSpec(name="train", image="localhost/fleet/torch:latest", command=command, gpus=1))
    status = job.wait(timeout=180)
    assert status.state == JobState.SUCCEEDED, docker_procs.logs()
    assert (status.attempt, status.failures) == (2, 1)
    assert "crashing at step 55 on purpose" in job.logs(attempt=1)
    assert "resumed from step 50 (attempt 2)" in job.logs(attempt=2)
    assert digest(job.logs()) == uninterrupted_digest(tmp_path)
    assert checkpoints.latest(tmp_path / "checkpoints" / job.id) == "step-0000000120.ckpt"
