"""The SDK's checkpoint contract: atomic writes, a `latest` marker, FLEET_RESUME_FROM honoured."""

from __future__ import annotations

from pathlib import Path

import pytest

import fleet_worker as fw
from fleet import checkpoints


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
