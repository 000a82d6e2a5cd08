"""The SDK's checkpoint contract: atomic writes, a `latest` marker, FLEET_RESUME_FROM honoured."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import fleet_worker as fw
from fleet.agent import checkpoints
from tests.conftest import need_torch


@pytest.fixture(autouse=True)
def ckpt_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("FLEET_RESUME_FROM", raising=False)
    return tmp_path


def test_fresh_start_has_nothing_to_resume() -> None:
    assert fw.load_latest() is None


def test_save_then_load_latest_and_prune(ckpt_env: Path) -> None:
    for step in (10, 20, 30):
        fw.save({"w": [step]}, step)
    assert fw.load_latest() == ({"w": [30]}, 30)
    assert sorted(p.name for p in ckpt_env.glob("step-*")) == ["step-0000000020.ckpt", "step-0000000030.ckpt"]
    # the host side reads the same marker
    assert checkpoints.latest(ckpt_env) == "step-0000000030.ckpt"


def test_a_crash_mid_write_never_becomes_latest(ckpt_env: Path) -> None:
    fw.save({"w": 1}, 1)
    # a writer killed after writing part of the next checkpoint leaves only a temporary file
    (ckpt_env / ".step-0000000002.ckpt.tmp-999").write_bytes(b"\x80half")
    assert fw.load_latest() == ({"w": 1}, 1)
    assert checkpoints.latest(ckpt_env) == "step-0000000001.ckpt"


def test_resume_from_names_the_checkpoint(ckpt_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = fw.save({"w": "a"}, 5)
    fw.save({"w": "b"}, 6)
    monkeypatch.setenv("FLEET_RESUME_FROM", str(first))
    assert fw.load_latest() == ({"w": "a"}, 5)


def test_marker_pointing_outside_the_directory_is_ignored(ckpt_env: Path) -> None:
    (ckpt_env / "latest").write_text("../../etc/passwd\n")
    assert checkpoints.latest(ckpt_env) is None


def test_marker_that_is_a_symlink_is_not_followed(
    ckpt_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Given a job that replaced its marker (and a checkpoint name) with symlinks to host files
    outside = tmp_path_factory.mktemp("host")
    (outside / "secret").write_text("step-0000000001.ckpt\n")
    (ckpt_env / "latest").symlink_to(outside / "secret")
    # Then the host side (the agent, as root) reads neither
    assert checkpoints.latest(ckpt_env) is None
    (ckpt_env / "latest").unlink()
    (ckpt_env / "step-0000000001.ckpt").symlink_to(outside / "secret")
    (ckpt_env / "latest").write_text("step-0000000001.ckpt\n")
    assert checkpoints.latest(ckpt_env) is None


def test_a_huge_marker_is_read_only_up_to_its_cap(ckpt_env: Path) -> None:
    # Given a job that made its marker a 1 TiB (sparse) file after a valid first line
    (ckpt_env / "step-0000000001.ckpt").write_bytes(b"x")
    with open(ckpt_env / "latest", "wb") as f:
        f.write(b"step-0000000001.ckpt\n1\n")
        f.truncate(1 << 40)
    # Then the agent reads only the first few KiB: it gets the name without loading the file
    assert checkpoints.latest(ckpt_env) == "step-0000000001.ckpt"


def test_marker_that_is_a_fifo_does_not_hang_the_reader(ckpt_env: Path) -> None:
    import os

    os.mkfifo(ckpt_env / "latest")
    assert checkpoints.latest(ckpt_env) is None


def test_a_stale_attempt_never_moves_latest_backwards(
    ckpt_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given attempt 1 saved step 10, then the agent started attempt 2 (it writes .fleet-attempt)
    monkeypatch.setenv("FLEET_ATTEMPT", "1")
    fw.save({"w": 10}, 10)
    checkpoints.prepare(ckpt_env.parent, ckpt_env.name, 2, None, None)
    # When attempt 1, still running somewhere, tries to save step 20
    with pytest.raises(fw.StaleAttempt, match="attempt 2"):
        fw.save({"w": 20}, 20)
    # Then latest still names attempt 1's step 10; attempt 2 saves and is recorded in the marker
    assert checkpoints.read_marker(ckpt_env) == checkpoints.Marker("step-0000000010.ckpt", 1)
    monkeypatch.setenv("FLEET_ATTEMPT", "2")
    fw.save({"w": 15}, 15)
    assert checkpoints.read_marker(ckpt_env) == checkpoints.Marker("step-0000000015.ckpt", 2)
    monkeypatch.setenv("FLEET_ATTEMPT", "1")
    with pytest.raises(fw.StaleAttempt):
        fw.save({"w": 30}, 30)


def test_temporary_names_differ_per_attempt(ckpt_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_worker import checkpoint

    seen = []
    real = checkpoint.os.replace
    monkeypatch.setattr(checkpoint.os, "replace", lambda a, b: (seen.append(Path(a).name), real(a, b)))
    for n in ("1", "2"):
        monkeypatch.setenv("FLEET_ATTEMPT", n)
        fw.save({"w": n}, 1)
    assert seen[0].split(".tmp-")[1].startswith("1-") and seen[2].split(".tmp-")[1].startswith("2-")
    assert len(set(seen)) == len(seen)


def test_a_job_that_checkpoints_plain_data_never_imports_torch(ckpt_env: Path) -> None:
    # importing torch costs seconds of CPU: a job whose state is a dict must not pay it to checkpoint
    code = (
        "import sys, fleet_worker as fw\n"
        "fw.save({'step': 3, 'loss': [0.5]}, 3)\n"
        "print(fw.load_latest(), 'torch' in sys.modules)"
    )
    env = {**os.environ, "FLEET_CHECKPOINT_DIR": str(ckpt_env)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == "({'step': 3, 'loss': [0.5]}, 3) False"


def test_a_job_that_uses_torch_checkpoints_tensors_with_torch_save(ckpt_env: Path) -> None:
    need_torch()
    import torch

    # Given a job that imported torch and checkpoints tensors
    fw.save({"w": torch.arange(4.0)}, 1)
    # Then the file is torch.save's (a zip archive), and it loads back as tensors
    assert (ckpt_env / "step-0000000001.ckpt").read_bytes()[:4] == b"PK\x03\x04"
    state, step = fw.load_latest()  # type: ignore[misc]
    assert step == 1 and torch.equal(state["w"], torch.arange(4.0))
    # And a checkpoint a job without torch wrote (a pickle) still loads where torch is imported
    fw.save({"w": [1.0]}, 2)  # torch is imported here: make the pickle the way such a job does
    (ckpt_env / "step-0000000002.ckpt").write_bytes(pickle.dumps({"step": 2, "state": {"w": [1.0]}}))
    assert fw.load_latest() == ({"w": [1.0]}, 2)
