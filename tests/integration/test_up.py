"""`fleet up`: a whole local fleet from one command, and nothing left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import psutil
import pytest

pytestmark = pytest.mark.integration


def test_fleet_up_demo_runs_jobs_to_completion_and_leaves_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "up", "--demo", "--runtime", "process", "--state-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "export FLEET_REDIS_URL=redis://127.0.0.1:" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith(("hello-", "two-gpus-", "flaky-"))]
    assert len(rows) == 3 and all(" SUCCEEDED " in r for r in rows), done.stdout
    leftovers = [
        p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip
    assert leftovers == []
