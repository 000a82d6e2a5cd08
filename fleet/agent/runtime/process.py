"""Attempts as plain processes (bare metal, development): own session, same environment contract.

Each attempt lives in ``<root>/<job>.<attempt>/``: ``meta.json`` (pid), ``output.log`` and, once it
ended, ``exit``. Memory and CPU limits are not enforced by this runtime (no cgroups); use Docker.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from fleet.agent.runtime.base import AttemptStatus, LaunchSpec
from fleet.models import Exit

_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


class ProcessRuntime:
    name = "process"

    def __init__(self, node: str, root: Path) -> None:
        self.node = node
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._children: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self._on_exit: Callable[[str, int], None] | None = None
        self._lock = threading.Lock()

    def _dir(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{job_id}.{attempt}"

    def start(self, spec: LaunchSpec) -> None:
        folder = self._dir(spec.job_id, spec.attempt)
        if (folder / "meta.json").exists():
            return
        folder.mkdir(parents=True, exist_ok=True)
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        env.update(spec.fleet_env(str(spec.checkpoint_dir) if spec.checkpoint_dir else None))
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.agent.runtime.shim", str(folder), *spec.command],
            env=env, cwd=folder, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        meta = {"job": spec.job_id, "attempt": spec.attempt, "pid": proc.pid, "created": _created(proc.pid)}
        (folder / "meta.json").write_text(json.dumps(meta))
        with self._lock:
            self._children[(spec.job_id, spec.attempt)] = proc
        threading.Thread(target=self._reap, args=(spec.job_id, spec.attempt, proc), daemon=True).start()

    def _reap(self, job_id: str, attempt: int, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        with self._lock:
            self._children.pop((job_id, attempt), None)
        if self._on_exit is not None:
            self._on_exit(job_id, attempt)

    def status(self, job_id: str, attempt: int) -> AttemptStatus | None:
        folder = self._dir(job_id, attempt)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        exit_file = folder / "exit"
        if exit_file.exists():
            code = int(json.loads(exit_file.read_text())["code"])
            return AttemptStatus(job_id, attempt, False, Exit(code=code, reason=_describe(code)))
        if _alive(meta["pid"], meta["created"]):
            return AttemptStatus(job_id, attempt, True)
        return AttemptStatus(
            job_id, attempt, False, Exit(code=137, reason="killed before it could record an exit")
        )

    def attempts(self) -> list[AttemptStatus]:
        found = []
        for folder in sorted(self.root.iterdir()):
            job_id, _, attempt = folder.name.rpartition(".")
            if job_id and attempt.isdigit() and (status := self.status(job_id, int(attempt))) is not None:
                found.append(status)
        return found

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        status = self.status(job_id, attempt)
        if status is None or not status.running:
            return
        meta = json.loads((self._dir(job_id, attempt) / "meta.json").read_text())
        _signal_group(meta["pid"], signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _group(meta["pid"]):
                return
            time.sleep(0.05)
        _signal_group(meta["pid"], signal.SIGKILL)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for folder in self.root.iterdir():
            try:
                found.update(_group(json.loads((folder / "meta.json").read_text())["pid"]))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
        return found

    def remove(self, job_id: str, attempt: int) -> None:
        shutil.rmtree(self._dir(job_id, attempt), ignore_errors=True)

    def logs(self, job_id: str, attempt: int, cursor: str | None) -> Iterator[list[tuple[str, str]]]:
        path = self._dir(job_id, attempt) / "output.log"
        offset = int(cursor or 0)
        pending = b""
        while True:
            ended = (status := self.status(job_id, attempt)) is None or not status.running
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            consumed = str(offset - len(pending))
            if lines:
                yield [(consumed, line.decode(errors="replace")) for line in lines]
            if ended and not chunk:
                if pending:
                    yield [(str(offset), pending.decode(errors="replace"))]
                return
            if not chunk:
                time.sleep(0.05)

    def watch(self, on_exit: Callable[[str, int], None], stop: threading.Event) -> None:
        self._on_exit = on_exit

    def close(self) -> None:
        self._on_exit = None


def _created(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0.0


def _alive(pid: int, created: float) -> bool:
    """The shim ``pid`` still runs (and is not a recycled pid)."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group(pid: int) -> list[int]:
    """Live processes in the session the shim ``pid`` leads."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(proc.pid) == pid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _describe(code: int) -> str:
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"exited with code {code} ({signal.Signals(code - 128).name})"
    return f"exited with code {code}"
