"""The agent's side of the node supervisor (``fleet/agent/supervisor.py``): start it, talk to it.

Requests go over one connection under a lock; exits come back on a second, ``watch`` connection
read by a thread. The supervisor outlives the agent, so a restarted agent connects to the one
already holding its attempts instead of starting another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.agent import supervisor as server
from fleet.agent.cgroups import Joined
from fleet.errors import LaunchError, LeaseUnconfirmed, RuntimeUnavailable
from fleet.log import event

log = logging.getLogger("fleet.agent.supervision")


class SupervisorClient:
    def __init__(
        self,
        state_dir: Path,
        margin_s: float,
        tick_s: float = 0.05,
        idle_exit_s: float = 300.0,
        cgroup_dirs: list[Path] | None = None,
    ) -> None:
        self.state_dir, self.margin_s, self.tick_s, self.idle_exit_s = (
            state_dir,
            margin_s,
            tick_s,
            idle_exit_s,
        )
        #: the node's attempt cgroups, one directory per hierarchy (fleet.agent.cgroups)
        self.cgroup_dirs = cgroup_dirs or []
        self.path = state_dir / server.SOCKET
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._lock = threading.Lock()
        #: the lease's own connection: a confirmation never queues for ``_lock`` behind launches
        self._lease_sock: socket.socket | None = None
        self._lease_lock = threading.Lock()
        self._started: subprocess.Popen[bytes] | None = None
        #: what the supervisor reached can do (one of an older release, kept while it holds attempts)
        self.protocol = server.PROTOCOL

    # -- connection ------------------------------------------------------------------

    def ensure(self) -> None:
        """Connect to the node's supervisor, starting one when none answers."""
        with self._lock:
            if self._sock is None:
                self._connect_or_start()

    def _connect_or_start(self) -> None:
        try:
            self._attach(self._open())
        except OSError:
            pass
        else:
            if self._current():
                return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-I",
            server.__file__,
            str(self.state_dir),
            "--margin",
            str(self.margin_s),
            "--tick",
            str(self.tick_s),
            "--idle-exit",
            str(self.idle_exit_s),
            *(a for d in self.cgroup_dirs for a in ("--cgroup", str(d))),
        ]
        with open(self.state_dir / "supervisor.log", "ab") as out:
            # kept: the supervisor outlives this client, and a Popen dropped while its child runs warns
            self._started = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self._attach(self._open())
                event(log, "supervisor_started", dir=self.state_dir)
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeUnavailable(f"the node supervisor did not start; see {self.state_dir}/supervisor.log")

    def _current(self) -> bool:
        """Whether to keep the supervisor just reached. One of an older release (an agent upgraded in
        place) would start attempts outside their cgroups, or without forwarded stdin: it is replaced
        while it holds nothing, and kept, with a warning, while it holds attempts (they stay fenced;
        drain the node to move on)."""
        reply = self._exchange({"op": "ping"})
        protocol = self.protocol = int(reply.get("protocol", 1))
        if protocol >= server.PROTOCOL:
            return True
        if reply.get("held"):
            fix = (
                "drain the node, then restart the agent: until then new attempts are not in cgroups "
                "(protocol 1) or refuse forwarded stdin (protocol 2; in containers, protocol 3)"
            )
            held = len(reply["held"])
            event(log, "supervisor_outdated", logging.WARNING, protocol=protocol, held=held, fix=fix)
            return True
        self._exchange({"op": "shutdown"})
        self._drop()
        self.protocol = server.PROTOCOL  # the one started next
        pid, deadline = int(reply.get("pid", 0)), time.monotonic() + 10
        while pid and _running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        event(log, "supervisor_replaced", protocol=protocol, pid=pid)
        return False

    def _open(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        return sock

    def _attach(self, sock: socket.socket) -> None:
        self._sock, self._file = sock, sock.makefile("rb")

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request; on a broken connection reconnect (or restart the supervisor) and retry once."""
        with self._lock:
            for tried in range(2):
                try:
                    if self._sock is None:
                        self._connect_or_start()
                    return self._exchange({"op": op, **fields})
                except OSError:
                    self._drop()
                    if tried:
                        raise
        raise AssertionError("unreachable")

    def _exchange(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self._sock is not None
        self._sock.sendall(json.dumps(req).encode() + b"\n")
        line = self._file.readline()
        if not line:
            raise ConnectionResetError("supervisor closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._file.close()
                self._sock.close()
        self._sock = None

    # -- operations ------------------------------------------------------------------

    def lease(self, until_monotonic: float) -> None:
        """Confirm the lease on a connection of its own. On the shared one it waited for the lock
        behind every launch's spawn, and on a CPU-starved node long enough to lapse while the
        heartbeats reached Redis in time. Where none answers, the shared path starts a supervisor."""
        with self._lease_lock:
            try:
                if self._lease_sock is None:
                    self._lease_sock = self._open()
                req = {"op": "lease", "until": until_monotonic}
                self._lease_sock.sendall(json.dumps(req).encode() + b"\n")
                if not _read_line(self._lease_sock):
                    raise ConnectionResetError("supervisor closed the connection")
                return
            except OSError:
                self._drop_lease()
        self.request("lease", until=until_monotonic)

    def _drop_lease(self) -> None:
        if self._lease_sock is not None:
            with contextlib.suppress(OSError):
                self._lease_sock.close()
        self._lease_sock = None

    def spawn(
        self,
        key: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        uid: int | None,
        gid: int | None,
        cgroup: Joined | None = None,
        stdin: bool = False,
    ) -> int:
        joined = cgroup or Joined([], None)
        if stdin and self.protocol < 3:
            raise LaunchError(
                f"the node supervisor predates forwarded stdin (its protocol {self.protocol}): drain the "
                "node, then restart its agent",
                retryable=True,
            )
        reply = self.request(
            "spawn",
            key=key,
            argv=argv,
            env=env,
            cwd=cwd,
            uid=uid,
            gid=gid,
            cgroup_procs=joined.procs,
            cgroup_kill=joined.kill,
            stdin=stdin,
        )
        _refused(reply, "supervisor refused to start the attempt")
        return int(reply["pid"])

    def adopt(self, key: str, pid: int) -> bool:
        """Fence ``pid`` with the node's attempts; False when it is already gone."""
        reply = self.request("adopt", key=key, pid=pid)
        _refused(reply, "supervisor refused the attempt")
        return not reply.get("gone", False)

    def stdin_hold(self, key: str, path: Path) -> None:
        """The supervisor holds a writing end of a container's stdin pipe until its input ends."""
        if self.protocol < 4:
            raise LaunchError(
                f"the node supervisor predates forwarded stdin in containers (its protocol "
                f"{self.protocol}): drain the node, then restart its agent",
                retryable=True,
            )
        reply = self.request("stdin_hold", key=key, path=str(path))
        if "error" in reply:
            raise LaunchError(f"supervisor refused the attempt's stdin: {reply['error']}", retryable=True)

    def stdin_end(self, key: str) -> None:
        """The attempt's forwarded input ended: the supervisor lets go of its stdin pipe."""
        self.request("stdin_end", key=key)

    def stop(self, key: str, grace_s: float) -> None:
        self.request("stop", key=key, grace=grace_s)

    def drop(self, key: str) -> None:
        self.request("drop", key=key)

    def held(self) -> list[str]:
        return list(self.request("ping").get("held", []))

    def fenced(self, key: str) -> str | None:
        """Why the supervisor fenced this attempt, or None."""
        try:
            return (self.state_dir / server.FENCED / key).read_text().strip() or "fenced"
        except FileNotFoundError:
            return None

    def forget_fence(self, key: str) -> None:
        (self.state_dir / server.FENCED / key).unlink(missing_ok=True)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.request("shutdown")
        with self._lock:
            self._drop()
            if self._started is not None:  # one this client started: reap it once it exits
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._started.wait(timeout=10)

    def watch(self, on_exit: Callable[[str], None], stop: threading.Event) -> None:
        """Call ``on_exit(key)`` from a thread for every attempt the supervisor reaps."""
        threading.Thread(
            target=self._watch, args=(on_exit, stop), name="supervisor-watch", daemon=True
        ).start()

    def _watch(self, on_exit: Callable[[str], None], stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                sock = self._open()
                sock.settimeout(None)
                sock.sendall(b'{"op": "watch"}\n')
                with sock, sock.makefile("rb") as lines:
                    for line in lines:
                        key = json.loads(line).get("exit")
                        if key:
                            on_exit(str(key))
            except OSError:
                pass
            stop.wait(0.5)

    def close(self) -> None:
        with self._lock:
            self._drop()
        with self._lease_lock:
            self._drop_lease()


def _refused(reply: dict[str, Any], what: str) -> None:
    """Raise for a refusal in ``reply``: :class:`LeaseUnconfirmed` where the node's own lease lapsed."""
    error = reply.get("error")
    if error is None:
        return
    if str(error).startswith(server.UNLEASED):
        raise LeaseUnconfirmed(f"{what}: {error}")
    raise LaunchError(f"{what}: {error}", retryable=True)


def _read_line(sock: socket.socket) -> bytes:
    """One reply line (a lease's is a few bytes, so read byte by byte: nothing past it is taken)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            return b""
        line += byte
    return line


def stop_supervisor(state_dir: Path, wait_s: float = 10.0) -> int | None:
    """Stop the node supervisor of ``state_dir`` and every attempt it holds (``shutdown``, or SIGKILL
    when it does not answer); its pid, None when none runs. Never starts one."""
    pid = _supervisor_pid(state_dir)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(state_dir / server.SOCKET))
            sock.sendall(b'{"op": "shutdown"}\n')
            sock.recv(4096)
    except OSError:
        if pid is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # its attempts die with it (parent-death signal)
    deadline = time.monotonic() + wait_s
    while pid is not None and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def _supervisor_pid(state_dir: Path) -> int | None:
    """The pid in ``state_dir``'s pid file, if that process is still this state dir's supervisor
    (not a pid reused by something else since)."""
    try:
        pid = int((state_dir / server.PIDFILE).read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    ours = any(a.endswith(b"supervisor.py") for a in argv) and os.fsencode(str(state_dir)) in argv
    return pid if ours and _running(pid) else None


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited supervisor whose parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
