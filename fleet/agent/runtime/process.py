"""Attempts as plain processes (bare metal, development): own session, same environment contract.

The node supervisor (``fleet/agent/supervisor.py``) starts them, as the job's user, and records
their exit, so an agent restarted later learns how an attempt it did not start ended, and an
attempt is fenced even while no agent runs. Each attempt lives in ``<root>/<job>.<attempt>/``
(root-owned, 0711 as ``<root>`` is: ``meta.json`` with the pid, ``output.log``, ``exit`` once it
ended, each 0600, ``stdin``, a named pipe, for a job that reads forwarded input, and ``control``,
an elastic job's batch now) with a ``work`` directory the job owns (0700) as its working and home
directory (:mod:`fleet.agent.runtime.workspace`): a job passes through to its own, and reads nothing of
another's, not even its output. Each attempt runs in a cgroup of its own (``fleet.agent.cgroups``)
with its memory, CPU and pids limits; killing it kills every process it started. Where cgroups
cannot be used, attempts are killed by process group and not limited.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from fleet.agent.cgroups import Cgroups, Layout, Limits
from fleet.agent.checkpoints import traversable
from fleet.agent.runtime.base import AttemptStatus, LaunchSpec, exit_reason
from fleet.agent.runtime.workspace import AttemptFolders, make_control, make_work
from fleet.agent.supervision import SupervisorClient
from fleet.errors import LaunchError
from fleet.models import Exit

MiB = 1 << 20
_PASS_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV")
#: output read per attempt per call while it runs; the rest comes with the next call
_READ_MAX = 1 << 20
#: a line without its newline that grows past this is shipped as is (a progress bar never ending it)
_LINE_MAX = 64 << 10


class ProcessRuntime(AttemptFolders):
    name = "process"

    def __init__(
        self, node: str, root: Path, supervisor: SupervisorClient, cgroups: Cgroups | None = None
    ) -> None:
        self.node, self.root, self.supervisor = node, root, supervisor
        self.cgroups = cgroups or Cgroups(Layout("none", why="not given"), "fleet", node)
        traversable(self.root)

    def start(self, spec: LaunchSpec) -> None:
        folder = self._dir(spec.job_id, spec.attempt)
        if (folder / "meta.json").exists():
            return
        # a copy of its own, writable by the job
        work = make_work(folder, spec.workdir, spec.user, files=spec.work_files())
        control = make_control(folder, spec)  # an elastic job's batch now, which may change as it runs
        uid, gid = spec.user if spec.user else (None, None)
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        env.update(HOME=str(work), TMPDIR=str(work))
        checkpoint = str(spec.checkpoint_dir) if spec.checkpoint_dir else None
        env.update(spec.fleet_env(checkpoint, str(control) if control else None))
        key = f"{spec.job_id}.{spec.attempt}"
        joined = self.cgroups.create(key, Limits(spec.memory, spec.cpus, spec.pids_limit))
        try:
            self.supervisor.spawn(key, list(spec.command), env, str(work), uid, gid, joined, spec.stdin)
        except LaunchError:
            self.cgroups.remove(key)
            raise

    def supervise(self, job_id: str, attempt: int) -> None:
        """Nothing to do: process attempts are the supervisor's own children."""

    def status(self, job_id: str, attempt: int) -> AttemptStatus | None:
        folder = self._dir(job_id, attempt)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        # /proc first, the exit file second: the supervisor writes the file before it reaps the
        # leader, so a leader already gone from /proc has its file unless the supervisor died
        leader = leader_state(meta["pid"], meta["created"], meta.get("supervisor"))
        key = f"{job_id}.{attempt}"
        with contextlib.suppress(FileNotFoundError):
            code = int(json.loads((folder / "exit").read_text())["code"])
            if (limit := self.cgroups.oom_limit(key)) is not None:
                reason = f"OOMKilled (memory limit {limit // MiB} MiB)"
                return AttemptStatus(job_id, attempt, False, Exit(code=code, oom=True, reason=reason))
            return AttemptStatus(job_id, attempt, False, Exit(code=code, reason=exit_reason(code)))
        if leader != "gone":  # running, or exited and about to be reaped by the supervisor
            return AttemptStatus(job_id, attempt, True)
        self.cgroups.kill(key)  # what its leader started outlives the parent-death signal
        return AttemptStatus(
            job_id,
            attempt,
            False,
            Exit(code=137, fault="infra", kind="lost", reason="its supervisor died before recording an exit"),
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
        if status is None:
            return
        if status.running:
            self.supervisor.stop(f"{job_id}.{attempt}", grace_s)
            deadline = time.monotonic() + grace_s + 5
            while time.monotonic() < deadline:
                status = self.status(job_id, attempt)
                if status is None or not status.running:
                    break
                time.sleep(0.05)
        self.cgroups.kill(f"{job_id}.{attempt}")

    def pids(self) -> set[int]:
        found: set[int] = set()
        for folder in self.root.iterdir():
            try:
                found.update(_group(json.loads((folder / "meta.json").read_text())["pid"]))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            found.update(self.cgroups.members(folder.name))
        return found

    def running(self, job_id: str, attempt: int) -> bool:
        status = self.status(job_id, attempt)
        return status is not None and status.running

    def remove(self, job_id: str, attempt: int) -> None:
        key = f"{job_id}.{attempt}"
        status = self.status(job_id, attempt)
        if status is not None and status.running:
            self.stop(job_id, attempt, 0)
        self.cgroups.remove(key)
        self.supervisor.forget_fence(key)
        shutil.rmtree(self._dir(job_id, attempt), ignore_errors=True)

    def read_logs(self, job_id: str, attempt: int, cursor: str | None, ended: bool) -> list[tuple[str, str]]:
        """The cursor is the byte offset in ``output.log`` after the line; no supervisor call."""
        offset = int(cursor or 0)
        try:
            with open(self._dir(job_id, attempt) / "output.log", "rb") as f:
                f.seek(offset)
                data = f.read() if ended else f.read(_READ_MAX)
        except FileNotFoundError:
            return []
        *lines, rest = data.split(b"\n")
        found = []
        for line in lines:
            offset += len(line) + 1
            found.append((str(offset), line.decode(errors="replace")))
        if rest and (ended or len(rest) >= _LINE_MAX):
            found.append((str(offset + len(rest)), rest.decode(errors="replace")))
        return found

    def watch(self, on_exit: Callable[[str, int], None], stop: threading.Event) -> None:
        def exited(key: str) -> None:
            job_id, _, attempt = key.rpartition(".")
            if attempt.isdigit():
                on_exit(job_id, int(attempt))

        self.supervisor.watch(exited, stop)

    def close(self) -> None:
        self.supervisor.close()


def leader_state(pid: int, created: float, supervisor: int | None) -> str:
    """ "running", "exited" (a zombie its live supervisor has not reaped yet) or "gone" (no such
    process, a recycled pid with another start time, or a zombie orphaned by its supervisor)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "gone"
    if float(stat[19]) != created:
        return "gone"
    if stat[0] != "Z":
        return "running"
    return "exited" if int(stat[1]) == supervisor else "gone"


def _group(pid: int) -> list[int]:
    """Live processes in the session the attempt's leader ``pid`` started."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(proc.pid) == pid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members
