"""Plumbing of the scale benchmark: child processes, deadlines, CPU meters, the controller's passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from fleet.config import load_settings
from fleet.state import connect

REPO = Path(__file__).resolve().parent.parent


class Result:
    """Rows of the report: what, value, and a note saying how it was measured or why it is missing."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.data: dict[str, Any] = {}

    def add(self, what: str, value: str, note: str = "", **data: Any) -> None:
        self.rows.append((what, value, note))
        self.data.update(data)
        print(f"| {what} | {value} | {note} |", flush=True)


class Services:
    """Child processes of this benchmark, with their logs in ``root``; stopped on exit."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        return proc

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def until(condition: Callable[[], object], timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return False


def passes(path: Path) -> list[tuple[float, float]]:
    """(start, seconds) of every pass the controller finished, from its tap file."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["at"] - r["s"], r["s"]) for r in rows]


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def cpu_over(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Percent of one core each process used over ``seconds``."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 100 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def pythonpath() -> str:
    """Children import this checkout's fleet and bench, whichever fleet is installed."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def redis_pid(url: str) -> int:
    return int(connect(load_settings(redis_url=url)).info("server")["process_id"])


class CpuMeter:
    """CPU used by a process over a window, as a percentage of one core."""

    def __init__(self, pid: int | None = None) -> None:
        self.proc = psutil.Process(pid)
        self.last = (time.monotonic(), self._cpu())

    def _cpu(self) -> float:
        times = self.proc.cpu_times()
        return float(times.user + times.system)

    def percent(self) -> float:
        """Since the previous call (or creation)."""
        now, cpu = time.monotonic(), self._cpu()
        (then, before), self.last = self.last, (now, cpu)
        return 100.0 * (cpu - before) / max(now - then, 1e-9)
