"""The DDP example as a two-member gang on one machine: torchrun per "node", fleet's environment.

Each member is started as fleet's supervisor starts an attempt (a session of its own, stopped by
signalling its process group), with the gang variables a multi-node job gets, one shared
checkpoint directory, and ``checkpoints.prepare`` run before each attempt as the agent does.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fleet.agent import checkpoints
from fleet.ops.local import free_port
from tests.conftest import need_torch

EXAMPLE = Path(__file__).resolve().parents[2] / "workers" / "examples" / "train_ddp.py"
JOB = "ddp-job"
STEPS, EVERY, BATCH = 120, 10, 32
#: seconds a collective waits for a peer (FLEET_DIST_TIMEOUT_S). A SIGKILLed member's kernel resets
#: its connections, so its peers fail at once whatever this is; a member that vanishes without a
#: reset (a frozen node, a partition) is only noticed when this runs out (torch's default: 30 min)
DIST_TIMEOUT_S = 5
#: time a surviving member may take to fail: the timeout, torchrun's shutdown, an interpreter exit
FAIL_WITHIN_S = DIST_TIMEOUT_S + 15


@pytest.fixture(autouse=True)
def torch_installed() -> None:
    need_torch()


class Member:
    """One member of the gang: its torchrun (or plain) process and the lines it printed."""

    def __init__(self, node: int, proc: subprocess.Popen[str]) -> None:
        self.node, self.proc, self.lines = node, proc, list[str]()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.match(pattern, line):
                    return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"node {self.node} never printed {pattern!r}:\n{self.output}")

    def finish(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {self.node} still runs after {timeout} s:\n{self.output}") from None
        self._reader.join(5)
        return code

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def worker_pid(self) -> int:
        return int(self.wait_for(r"rank \d+ of \d+ .* pid (\d+)").group(1))


@pytest.fixture
def members() -> Iterator[list[Member]]:
    """Every member a test starts; whatever still runs at the end is SIGKILLed."""
    started: list[Member] = []
    yield started
    for member in started:
        if member.proc.poll() is None:
            member.signal(signal.SIGKILL)  # its worker dies with it (fleet_worker.dist)
            member.finish()


def gang_env(directory: Path, attempt: int, nodes: int) -> dict[str, str]:
    """What every member of the attempt gets (the node's own rank is added per member)."""
    env = {k: v for k, v in os.environ.items() if k != "FLEET_RESUME_FROM"}
    env |= {
        "FLEET_JOB_ID": JOB,
        "FLEET_ATTEMPT": str(attempt),
        "FLEET_CHECKPOINT_DIR": str(directory),
        "FLEET_NUM_NODES": str(nodes),
        "FLEET_NUM_GPUS": "0",
        "WORLD_SIZE": str(nodes),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "FLEET_DIST_TIMEOUT_S": str(DIST_TIMEOUT_S),
    }
    if latest := checkpoints.latest(directory):
        env["FLEET_RESUME_FROM"] = str(directory / latest)
    return env


def start_gang(
    root: Path, started: list[Member], *args: str, attempt: int = 1, nodes: int = 2, plain: bool = False
) -> list[Member]:
    """Attempt ``attempt`` of the job, one member per node; ``plain``: no torchrun (one process)."""
    env = gang_env(checkpoints.prepare(root, JOB, attempt, None, None), attempt, nodes)
    job = [str(EXAMPLE), "--steps", str(STEPS), "--every", str(EVERY), "--global-batch", str(BATCH), *args]
    gang = []
    for node in range(nodes):
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",  # torchrun, from this interpreter
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--master-addr",
            env["MASTER_ADDR"],
            "--master-port",
            env["MASTER_PORT"],
        ]
        proc = subprocess.Popen(
            [*([sys.executable] if plain else torchrun), *job],
            env={**env, "FLEET_NODE_RANK": str(node), "NODE_RANK": str(node)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        gang.append(Member(node, proc))
    started.extend(gang)
    return gang


def logged_steps(output: str) -> list[int]:
    return [int(s) for s in re.findall(r"^step (\d+) loss", output, re.MULTILINE)]


def checkpoint_step(directory: Path) -> int:
    """The step of the checkpoint ``latest`` names, read as the agent reads it."""
    found = re.fullmatch(r"step-(\d+)\.ckpt", checkpoints.latest(directory) or "")
    assert found, checkpoints.latest(directory)
    return int(found.group(1))


def digest(member: Member) -> str:
    found = re.search(r"^final weights ([0-9a-f]{64})", member.output, re.MULTILINE)
    assert found, member.output
    return found.group(1)


def final_weights(directory: Path) -> dict[str, object]:
    import torch

    name = checkpoints.latest(directory)
    assert name == f"step-{STEPS:010d}.ckpt"
    state: dict[str, object] = torch.load(directory / name, weights_only=False)["state"]["model"]
    return state


def finish_ok(gang: list[Member]) -> None:
    for member in gang:
        assert member.finish() == 0, member.output


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Member], Path]]:
    """An uninterrupted two-member run: its members (finished) and its checkpoint directory."""
    root, started = tmp_path_factory.mktemp("straight"), list[Member]()
    gang = start_gang(root, started)
    finish_ok(gang)
    yield gang, root / JOB


def test_a_two_member_gang_trains_what_one_process_trains(
    straight: tuple[list[Member], Path], one_process: tuple[str, Path]
) -> None:
    # Given a two-member gang run (torchrun on each "node") and one plain process, same global batch
    gang, directory = straight
    printed, alone = one_process
    # Then each worker joined as the rank of its node in a world of two, and rank 0 logged every step
    for member in gang:
        assert f"rank {member.node} of 2 local_rank 0 node {member.node} of 2 attempt 1" in member.output
    assert "rank 0 of 1 local_rank 0 node 0 of 1" in printed
    assert logged_steps(gang[0].output) == logged_steps(printed) == list(range(1, STEPS + 1))
    assert logged_steps(gang[1].output) == []
    # And the models agree to atol 1e-5. Not bit for bit: each rank averages the loss over its half
    # of the batch and the all-reduce averages the halves, where one process averages over the whole
    # batch, so the float32 sums round differently, by an ulp or so per step. The regression
    # converges, so the differences do not compound: measured after these 120 steps, at most 1.0e-7
    # (weights up to 0.65; the same with 4 ranks). 1e-5 leaves ~100x room for that, and is ~300x
    # below what one step less (3.0e-3) or training on half the batch (0.16) changes, so a wrong
    # split of the batch or a lost step fails here.
    import torch

    expected, actual = final_weights(alone), final_weights(directory)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("victim", [0, 1], ids=["rank0-node", "rank1-node"])
def test_a_killed_member_fails_the_gang_and_the_next_attempt_resumes(
    victim: int, straight: tuple[list[Member], Path], tmp_path: Path, members: list[Member]
) -> None:
    # Given a gang whose `victim` node dies (SIGKILL to its process group) at a random step
    gang = start_gang(tmp_path, members, "--sleep", "0.02")
    worker = gang[victim].worker_pid()
    saved = random.Random().randrange(2, STEPS // EVERY - 1) * EVERY
    gang[0].wait_for(rf'fleet-progress \{{"step": {saved}\b')
    time.sleep(random.uniform(0, EVERY * 0.02))  # anywhere before the next checkpoint, or just after
    gang[victim].signal(signal.SIGKILL)
    # Then the other member fails within seconds, and the dead member's worker did not live on
    assert gang[1 - victim].finish(timeout=FAIL_WITHIN_S) != 0
    gang[victim].finish()
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    # When the agent starts attempt 2 of the whole gang from the latest checkpoint (its members
    # without torchrun: the ranks, world and shards are the same, and each torchrun costs seconds)
    resumed = checkpoint_step(tmp_path / JOB)
    assert saved <= resumed <= max(logged_steps(gang[0].output)) < STEPS
    again = start_gang(tmp_path, members, attempt=2, plain=True)
    finish_ok(again)
    # Then every rank resumed from that checkpoint, no step up to it ran again, and the model is the
    # uninterrupted run's, bit for bit (same world size, same shards, same reduction order)
    for member in again:
        assert f"rank {member.node} resumed from step {resumed} (attempt 2)" in member.output
    assert logged_steps(again[0].output) == list(range(resumed + 1, STEPS + 1))
    assert digest(again[0]) == digest(straight[0][0])


def test_a_frozen_member_fails_the_gang_after_the_collective_timeout(
    tmp_path: Path, members: list[Member]
) -> None:
    # Given a gang whose rank-0 node freezes (SIGSTOP: no exit, no connection reset; it also hosts
    # torchrun's store) while training
    gang = start_gang(tmp_path, members, "--sleep", "0.02")
    frozen = [gang[0].worker_pid(), gang[0].proc.pid]
    gang[0].wait_for(r'fleet-progress \{"step": 20\b')
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    # Then the other member fails once FLEET_DIST_TIMEOUT_S runs out, not after torch's 30 minutes
    try:
        assert gang[1].finish(timeout=FAIL_WITHIN_S) != 0
    finally:
        gang[0].signal(signal.SIGKILL)
        gang[0].finish()
    assert f"Timed out waiting {DIST_TIMEOUT_S * 1000}ms" in gang[1].output


def test_sigterm_to_one_member_stops_the_gang_at_one_checkpoint(
    tmp_path: Path, members: list[Member]
) -> None:
    # Given a running gang
    gang = start_gang(tmp_path, members, "--sleep", "0.02")
    gang[0].wait_for(r'fleet-progress \{"step": 20\b')
    # When only node 1 gets SIGTERM (fleet's stop reaches members one by one)
    gang[1].signal(signal.SIGTERM)
    # Then both ranks checkpoint at the same step, the last one rank 0 logged, and leave
    codes = [member.finish() for member in gang]
    for member in gang:
        assert "stopping on SIGTERM after checkpoint (exit 143)" in member.output, member.output
    # torchrun reports a worker's 143 as its own exit 1 (ChildFailedError, or the signal on node 1)
    assert codes == [1, 1]
    last = logged_steps(gang[0].output)[-1]
    assert 20 < last < STEPS
    assert checkpoints.read_marker(tmp_path / JOB) == checkpoints.Marker(f"step-{last:010d}.ckpt", 1)


def test_a_stale_gang_stops_at_its_next_checkpoint(tmp_path: Path, members: list[Member]) -> None:
    # Given attempt 1 of a gang (members without torchrun) still running after checkpoint 10 when
    # the agent starts attempt 2
    gang = start_gang(tmp_path, members, "--sleep", "0.02", plain=True)
    gang[0].wait_for(r'fleet-progress \{"step": 10\b')
    checkpoints.prepare(tmp_path, JOB, 2, None, None)
    # Then at its next checkpoint rank 0 refuses to write, every rank raises StaleAttempt (none waits
    # for a checkpoint that never comes), and `latest` still names attempt 1's last checkpoint
    for member in gang:
        assert member.finish(timeout=FAIL_WITHIN_S) != 0
        assert "StaleAttempt: attempt 1 is stale: attempt 2 of this job has started" in member.output
    marker = checkpoints.read_marker(tmp_path / JOB)
    assert marker is not None and marker.attempt == 1
    assert max(logged_steps(gang[0].output)) == checkpoint_step(tmp_path / JOB) + EVERY
