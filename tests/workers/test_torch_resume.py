"""The torch example killed at a random step and resumed ends with bit-identical weights."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.agent import checkpoints
from tests.conftest import need

EXAMPLE = Path(__file__).resolve().parents[2] / "workers" / "examples" / "train_regression.py"


@pytest.fixture(autouse=True)
def torch_installed() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        need(False, "torch not installed (make install installs torch==2.13.0, the CPU wheel)")


def run(ckpt: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    full_env = {**os.environ, "FLEET_CHECKPOINT_DIR": str(ckpt), "FLEET_ATTEMPT": "1", **env}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--steps", "120", "--every", "10", *args],
        env=full_env,
        stdout=subprocess.PIPE,
        text=True,
    )


def digest(output: str) -> str:
    found = re.search(r"weights ([0-9a-f]{64})", output)
    assert found, output
    return found.group(1)


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    straight = run(tmp_path / "a")
    expected = digest(straight.communicate(timeout=120)[0])
    # Given a run SIGKILLed (no chance to checkpoint) at a random step
    kill_after = random.Random().randint(15, 95)
    victim = run(tmp_path / "b", "--sleep", "0.02")
    assert victim.stdout is not None
    for line in victim.stdout:
        step = re.match(r'fleet-progress \{"step": (\d+)', line)
        if step and int(step.group(1)) >= kill_after:
            victim.send_signal(signal.SIGKILL)
            break
    victim.communicate(timeout=30)
    assert victim.returncode == -signal.SIGKILL
    # When it is started again on the same checkpoint directory (attempt 2)
    again = run(tmp_path / "b", FLEET_ATTEMPT="2")
    output = again.communicate(timeout=120)[0]
    # Then it resumed from a checkpoint at or after the kill point and ends bit-identical
    resumed = int(re.search(r"resumed from step (\d+)", output).group(1))  # type: ignore[union-attr]
    assert kill_after <= resumed < 120
    assert digest(output) == expected


def test_sigterm_checkpoints_and_exits_143(tmp_path: Path) -> None:
    proc = run(tmp_path, "--sleep", "0.05")
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("fleet-progress")  # running, handler installed
    proc.send_signal(signal.SIGTERM)
    output = first + proc.communicate(timeout=30)[0]
    assert proc.returncode == 143
    assert "stopping on SIGTERM after checkpoint" in output
    last = int(re.findall(r'"step": (\d+)', output)[-1])
    assert checkpoints.latest(tmp_path) == f"step-{last:010d}.ckpt"
