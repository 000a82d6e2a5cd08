"""The node's attempt supervisor: holds every attempt and fences them even while the agent is down.

``python -I fleet/agent/supervisor.py STATE_DIR --margin S --idle-exit S [--cgroup DIR]...`` runs
one per node, in a session of its own, so it outlives agent restarts (and the agent unit's
``KillMode=process``). The agent starts it when none answers on ``STATE_DIR/supervisor.sock`` and
then, over that socket (JSON lines):

- ``lease {until}``: the node lease is confirmed until ``until`` (CLOCK_MONOTONIC, shared by every
  process on the host). Once ``until - margin`` passes unconfirmed, every attempt is SIGKILLed and
  recorded as fenced (``fenced/<job>.<attempt>``): the controller requeues the jobs of a node whose
  lease expired, so they must be dead before it can. This holds whether the agent is alive or not.
- ``spawn {key, argv, env, cwd, uid, gid, cgroup_procs, cgroup_kill}``: start a process-runtime
  attempt in a session of its own, in the cgroups whose ``cgroup.procs`` files are listed (the agent
  made them and wrote their limits), as ``uid``/``gid``, output to ``attempts/<key>/output.log``,
  with a parent-death signal. Its pid goes to ``meta.json``, its exit code to ``exit`` when it
  ends, and ``{"exit": key}`` is pushed to connections that sent ``watch``. These three files are
  0600 in a 0711 folder: no job reads another's output. With ``stdin``, the attempt's stdin is the
  named pipe ``attempts/<key>/stdin`` (0600, for the agent to write into) instead of /dev/null; the
  supervisor holds a writing end of its own, so the job reads no EOF while no agent writes (before
  the agent opens it, across agent restarts), until ``stdin_end {key}`` (the input ended) closes it.
- ``adopt {key, pid}``: also fence this process (a Docker container's init), through a pidfd.
- ``stdin_hold {key, path}``: hold a writing end of the named pipe at ``path`` (the agent made it in
  a Docker attempt's folder, and the container reads it as stdin), as for a spawned attempt's, until
  ``stdin_end {key}``, ``drop {key}`` or the adopted process's end.
- ``stop {key, grace}``: SIGTERM the attempt's process group, SIGKILL after ``grace`` seconds.
- ``drop {key}`` (forget an attempt), ``ping``, ``shutdown`` (kill everything and exit).

Every SIGKILL of a spawned attempt (a stop past its grace, the fence, its leader's exit, shutdown)
kills its whole cgroup (``cgroup_kill``, else each pid of the first ``cgroup_procs``), so a process
the job moved to a session of its own dies too; the parent-death signal reaches only the leader, so
a supervisor that starts kills what a dead predecessor left in the attempt cgroups under each
``--cgroup`` directory (it holds no attempt yet: all of them are leftovers).

When it ends: once it holds no attempt, no agent is connected and none has spoken to it for
``--idle-exit`` seconds (an agent uninstalled, or gone for good), it exits; a restarted agent starts
a new one. SIGTERM makes an idle supervisor (no attempt held) exit at once; one holding attempts
ignores it and says so in its log, since it exists to keep them fenced across agent restarts and
stops (``shutdown`` over the socket ends it and them: ``fleet uninstall agent`` does). SIGHUP is
ignored.

Launching costs a fork and an exec, not a Python interpreter per attempt. Standard library only,
one thread, nothing else imported: the supervisor must be small enough to trust.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOCKET, PIDFILE, ATTEMPTS, FENCED = "supervisor.sock", "supervisor.pid", "attempts", "fenced"
#: how a refusal for an unconfirmed lease begins (the agent tells it from the node's faults by it)
UNLEASED = "node lease not confirmed"
#: what this supervisor can do, in its ``ping`` answer: 2 puts attempts in their cgroups, 3 gives them
#: a named pipe as stdin, 4 holds one for a container (one of an older release answers no ``protocol``: 1)
PROTOCOL = 4
_PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once here: a child calls it between fork and exec, where every
    microsecond is paid for each job started."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
_EXITED = os.WEXITED | os.WNOHANG | os.WNOWAIT
_SELF = [os.getpid()]
_WAKEUP: list[socket.socket] = []


@dataclass
class Held:
    key: str
    pid: int
    pidfd: int
    group: bool  # a spawned attempt leads its own process group; an adopted pid is signalled alone
    proc: subprocess.Popen[bytes] | None = None
    #: a spawned attempt's cgroup: (its cgroup.kill or None, its cgroup.procs)
    cgroup: tuple[str | None, str] | None = None
    kill_at: float | None = None
    fenced: bool = False
    #: the supervisor's own writing end of the attempt's stdin pipe, until its input ends
    stdin_hold: int | None = None


@dataclass
class Supervisor:
    state_dir: Path
    margin: float
    #: exit once idle (nothing held, no agent connected or heard) this long
    idle_exit_s: float = 300.0
    until: float = 0.0
    #: when an agent last spoke or hung up (CLOCK_MONOTONIC)
    heard_at: float = field(default_factory=time.monotonic)
    #: a SIGTERM arrived and is not handled yet
    terminate: bool = False
    held: dict[str, Held] = field(default_factory=dict)
    #: writing ends of containers' stdin pipes (``stdin_hold``) whose init is not adopted yet
    stdin_holds: dict[str, int] = field(default_factory=dict)
    watchers: list[socket.socket] = field(default_factory=list)
    running: bool = True

    # -- fencing ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self._reap()
        if self.held and now >= self.until - self.margin:
            self.fence(now)
        for held in list(self.held.values()):
            if held.kill_at is not None and now >= held.kill_at:
                self._signal(held, signal.SIGKILL)

    def should_exit(self, now: float, connected: bool) -> bool:
        """Whether to exit now: asked to (SIGTERM) or idle long enough, holding no attempt."""
        if self.terminate:
            self.terminate = False
            if not self.held:
                _log("exit reason=SIGTERM")
                return True
            _log(f"sigterm_ignored attempts={len(self.held)} (they stay fenced; `shutdown` ends them)")
        if connected:
            self.heard_at = now
        elif not self.held and now - self.heard_at >= self.idle_exit_s:
            _log(f"exit reason=idle idle_s={now - self.heard_at:.1f} (no attempt held, no agent)")
            return True
        return False

    def fence(self, now: float) -> None:
        late = now - (self.until - self.margin)
        fresh = [h for h in self.held.values() if not h.fenced]
        for held in fresh:
            (self.state_dir / FENCED).mkdir(mode=0o700, exist_ok=True)
            (self.state_dir / FENCED / held.key).write_text(
                f"lease unconfirmed {late:.2f}s past the margin\n"
            )
            held.fenced = True
        for held in list(self.held.values()):
            self._signal(held, signal.SIGKILL)
        if fresh:
            _log(f"fenced attempts={len(fresh)} late_s={late:.2f}")

    def _signal(self, held: Held, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if held.group:
                os.killpg(held.pid, sig)
            else:
                signal.pidfd_send_signal(held.pidfd, sig)
        if sig == signal.SIGKILL and held.cgroup is not None:
            kill_cgroup(*held.cgroup)

    # -- children --------------------------------------------------------------------

    def spawn(self, req: dict[str, Any]) -> dict[str, Any]:
        key = _key(req["key"])
        if key in self.held:
            return {"pid": self.held[key].pid}
        if time.monotonic() >= self.until - self.margin:
            return {"error": f"{UNLEASED}: refusing to start an attempt"}
        procs = [_cgroup_file(p, "cgroup.procs") for p in req.get("cgroup_procs") or []]
        kill = _cgroup_file(req["cgroup_kill"], "cgroup.kill") if req.get("cgroup_kill") else None
        folder = self.state_dir / ATTEMPTS / key
        folder.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(folder, 0o711)  # the job passes through to its work dir; lists nothing
        stdin, hold = _stdin_pipe(folder / "stdin") if req.get("stdin") else (subprocess.DEVNULL, None)
        with _private(folder / "output.log", os.O_WRONLY | os.O_APPEND) as out:
            try:
                proc = _popen(req, out, procs, stdin)
            except subprocess.SubprocessError:  # its cgroup, or the switch to its user, failed
                _close(hold)
                return {"error": f"cannot put the attempt in its cgroup {procs[:1]} or switch to its user"}
            except OSError as exc:
                out.write(f"fleet: cannot run {req['argv'][0]!r}: {exc.strerror}\n".encode())
                _write_json(folder / "exit", {"code": 127 if isinstance(exc, FileNotFoundError) else 126})
                _write_json(folder / "meta.json", {"pid": 0, "created": 0})
                self._notify(key)
                _close(hold)
                return {"pid": 0}
            finally:
                if isinstance(stdin, int) and stdin >= 0:
                    os.close(stdin)  # the job's reading end is the job's alone
        meta = {"pid": proc.pid, "created": _created(proc.pid), "supervisor": os.getpid()}
        _write_json(folder / "meta.json", meta)
        cgroup = (kill, procs[0]) if procs else None
        self.held[key] = Held(
            key, proc.pid, os.pidfd_open(proc.pid), True, proc, cgroup=cgroup, stdin_hold=hold
        )
        return {"pid": proc.pid}

    def adopt(self, req: dict[str, Any]) -> dict[str, Any]:
        key, pid = _key(req["key"]), int(req["pid"])
        if time.monotonic() >= self.until - self.margin:
            return {"error": f"{UNLEASED}: refusing to adopt an attempt"}
        if key not in self.held:
            try:
                self.held[key] = Held(key, pid, os.pidfd_open(pid), False)
            except ProcessLookupError:
                _close(self.stdin_holds.pop(key, None))
                return {"gone": True}
        if key in self.stdin_holds:
            _close(self.held[key].stdin_hold)
            self.held[key].stdin_hold = self.stdin_holds.pop(key)
        return {"pid": pid}

    def stdin_hold(self, req: dict[str, Any]) -> dict[str, Any]:
        """Hold a writing end of a container's stdin pipe: the job reads no EOF while no agent writes.
        A new one (a launch tried again) replaces the one held, opened before that one is let go."""
        key = _key(req["key"])
        try:
            fd = _fifo_writer(str(req["path"]))
        except (OSError, ValueError) as exc:
            return {"error": f"cannot hold the stdin pipe {req['path']!r}: {exc}"}
        held = self.held.get(key)
        if held is not None:
            _close(held.stdin_hold)
            held.stdin_hold = fd
        else:
            _close(self.stdin_holds.get(key))
            self.stdin_holds[key] = fd
        return {"ok": True}

    def stop(self, req: dict[str, Any]) -> dict[str, Any]:
        held = self.held.get(_key(req["key"]))
        if held is not None:
            self._signal(held, signal.SIGTERM)
            held.kill_at = time.monotonic() + max(float(req.get("grace", 0)), 0.0)
        return {"held": held is not None}

    def _reap(self) -> None:
        for held in list(self.held.values()):
            if held.proc is not None and (info := os.waitid(os.P_PID, held.pid, _EXITED)) is not None:
                # the leader exited but is not reaped yet, so its group id cannot be reused: kill
                # whatever of the job it left behind, write the exit code, and only then reap, so
                # that a leader gone from /proc always has its exit file (see ProcessRuntime.status)
                self._signal(held, signal.SIGKILL)
                code = info.si_status if info.si_code == os.CLD_EXITED else 128 + info.si_status
                _write_json(self.state_dir / ATTEMPTS / held.key / "exit", {"code": code, "at": time.time()})
                held.proc.wait()
                self._forget(held.key)
                self._notify(held.key)
            elif held.proc is None and not _alive(held.pidfd):
                self._forget(held.key)

    def stdin_end(self, req: dict[str, Any]) -> dict[str, Any]:
        """The attempt's input ended: the job reads EOF once no agent holds the pipe open either."""
        key = _key(req["key"])
        _close(self.stdin_holds.pop(key, None))
        held = self.held.get(key)
        if held is not None:
            _close(held.stdin_hold)
            held.stdin_hold = None
        return {"held": held is not None}

    def _forget(self, key: str) -> None:
        _close(self.stdin_holds.pop(key, None))
        held = self.held.pop(key, None)
        if held is not None:
            os.close(held.pidfd)
            _close(held.stdin_hold)

    def _notify(self, key: str) -> None:
        for conn in list(self.watchers):
            try:
                conn.sendall(json.dumps({"exit": key}).encode() + b"\n")
            except OSError:
                self.watchers.remove(conn)

    def shutdown(self) -> None:
        for held in list(self.held.values()):
            self._signal(held, signal.SIGKILL)
        self.running = False

    # -- requests --------------------------------------------------------------------

    def handle(self, conn: socket.socket, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "lease":
            self.until = max(self.until, float(req["until"]))
            return {"ok": True}
        if op == "watch":
            self.watchers.append(conn)
            return {"ok": True}
        if op == "ping":
            return {"pid": os.getpid(), "held": sorted(self.held), "protocol": PROTOCOL}
        if op == "drop":
            self._forget(_key(req["key"]))
            return {"ok": True}
        if op == "shutdown":
            self.shutdown()
            return {"ok": True}
        handlers = {
            "spawn": self.spawn,
            "adopt": self.adopt,
            "stop": self.stop,
            "stdin_end": self.stdin_end,
            "stdin_hold": self.stdin_hold,
        }
        handler = handlers.get(str(op))
        if handler is None:
            return {"error": f"unknown op {op!r}"}
        return handler(req)


def _key(key: object) -> str:
    """``<job>.<attempt>``: job ids are validated by fleet; checked again since it becomes a path."""
    text = str(key)
    if not text or text[0] == "." or "/" in text or "\x00" in text or len(text) > 160:
        raise ValueError(f"bad attempt key {text!r}")
    return text


def _cgroup_file(path: object, name: str) -> str:
    """A cgroup's ``cgroup.procs`` or ``cgroup.kill``: the agent's word, checked since it is written to."""
    text = str(path)
    if not text.startswith("/") or Path(text).name != name or "/../" in text or "\x00" in text:
        raise ValueError(f"bad cgroup file {text!r}")
    return text


def _stdin_pipe(path: Path) -> tuple[int, int]:
    """A fresh named pipe at ``path`` (0600: the agent writes into it as root, or as the user the
    supervisor runs as): its reading end (the job's stdin) and a writing end the supervisor holds."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mkfifo(path, 0o600)
    os.chmod(path, 0o600)
    # non-blocking, or the open would wait for a writer; the job's end then blocks as a pipe does
    reading = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    os.set_blocking(reading, True)
    return reading, os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)


def _fifo_writer(path: str) -> int:
    """A writing end of the named pipe at ``path`` (the agent's word, checked since it is opened):
    opened while a reading end of this process's own is, which is closed again, so the job's end
    alone reads it."""
    if not path.startswith("/") or "/../" in path or "\x00" in path or Path(path).name != "stdin":
        raise ValueError("not an attempt's stdin pipe")
    flags = os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    reading = os.open(path, os.O_RDONLY | flags)
    try:
        if not stat.S_ISFIFO(os.fstat(reading).st_mode):
            raise ValueError("not a named pipe")
        return os.open(path, os.O_WRONLY | flags)
    finally:
        os.close(reading)


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _popen(req: dict[str, Any], out: Any, procs: list[str], stdin: int) -> subprocess.Popen[bytes]:
    uid: int | None = req.get("uid")
    gid: int | None = req.get("gid")
    if uid is None or os.geteuid() != 0:  # an agent that is not root runs jobs as itself
        uid, gid = None, None
    return subprocess.Popen(
        [str(a) for a in req["argv"]],
        env={str(k): str(v) for k, v in req["env"].items()},
        cwd=req.get("cwd"),
        stdin=stdin,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        preexec_fn=lambda: _in_child(procs, uid, gid),
    )


def _in_child(procs: list[str], uid: int | None, gid: int | None) -> None:
    """In the child before exec, in this order: join the attempt's cgroups (root may), become its
    user (Popen's own switch would come before this function), then ask for SIGKILL when the
    supervisor dies, so no job is ever orphaned (a change of credentials clears that request). And
    the signals the supervisor ignores are the job's again (ignored ones survive exec)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    for path in procs:
        with open(path, "w") as f:
            f.write("0")
    if uid is not None:
        os.setgroups([])
        if gid is not None:
            os.setgid(gid)
        os.setuid(uid)
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != _SELF[0]:  # the supervisor died before the signal was armed
        os._exit(137)


def kill_cgroup(kill: str | None, procs: str) -> None:
    """SIGKILL every process of a cgroup: write 1 to its ``cgroup.kill`` (Linux 5.14+: the kernel
    kills them all, those forking meanwhile too); else SIGKILL each pid its ``cgroup.procs`` lists,
    again until a round finds no pid it has not signalled (a fork bomb's children keep coming)."""
    if kill is not None:
        try:
            with open(kill, "w") as f:
                f.write("1")
            return
        except FileNotFoundError:  # no such cgroup (any more)
            return
        except OSError:
            pass
    signalled: set[int] = set()
    for _ in range(1000):
        try:
            with open(procs) as f:
                fresh = {int(p) for p in f.read().split()} - signalled
        except (OSError, ValueError):
            return
        if not fresh:
            return
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        signalled |= fresh


def kill_leftovers(node_dirs: list[Path]) -> int:
    """Kill whatever runs in the attempt cgroups under ``node_dirs`` (a dead supervisor's attempts,
    their children that escaped its parent-death signal); how many cgroups held a process."""
    killed = 0
    for folder in node_dirs:
        with contextlib.suppress(OSError):
            for cgroup in sorted(p for p in folder.iterdir() if p.is_dir()):
                procs = cgroup / "cgroup.procs"
                with contextlib.suppress(OSError):
                    if procs.read_text().split():
                        kill = cgroup / "cgroup.kill"
                        kill_cgroup(str(kill) if kill.exists() else None, str(procs))
                        killed += 1
    return killed


def _alive(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def _created(pid: int) -> float:
    """Process start time in clock ticks (from /proc), to tell a recycled pid apart."""
    try:
        return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0.0


def _private(path: Path, flags: int) -> Any:
    """``path`` opened (binary), created 0600 whatever the umask: only root reads an attempt's files."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab" if flags & os.O_APPEND else "wb")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with _private(tmp, os.O_WRONLY | os.O_TRUNC) as f:
        f.write(json.dumps(data).encode())
    os.replace(tmp, path)


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor {line}", file=sys.stderr, flush=True)


# -- the loop -------------------------------------------------------------------------


def serve(
    state_dir: Path,
    margin: float,
    tick_s: float,
    idle_exit_s: float = 300.0,
    cgroups: list[Path] | None = None,
) -> None:
    sup = Supervisor(state_dir, margin, idle_exit_s)
    if cgroups and (killed := kill_leftovers(cgroups)):
        _log(f"killed_leftovers cgroups={killed} (attempts of a supervisor that died)")
    path = state_dir / SOCKET
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is the agent's (root's) alone
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(16)
    bound = path.stat().st_ino
    (state_dir / PIDFILE).write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: setattr(sup, "terminate", True))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    wakeup = _child_wakeup()
    sel.register(wakeup, selectors.EVENT_READ)  # reap at once, not on the next tick
    buffers: dict[socket.socket, bytes] = {}
    _log(f"started pid={os.getpid()} margin_s={margin} idle_exit_s={idle_exit_s}")
    while sup.running:
        for ready, _ in sel.select(tick_s):
            sock = ready.fileobj
            assert isinstance(sock, socket.socket)
            if sock is wakeup:  # SIGCHLD: a child exited
                with contextlib.suppress(BlockingIOError):
                    wakeup.recv(4096)
            elif sock is listener:
                conn, _ = listener.accept()
                sel.register(conn, selectors.EVENT_READ)
                buffers[conn] = b""
            else:
                _read(sup, sel, sock, buffers)
        now = time.monotonic()
        try:
            sup.tick(now)
        except Exception as exc:  # the fence must outlive any one bad attempt
            _log(f"tick_failed error={type(exc).__name__}: {exc}")
        if sup.running and sup.should_exit(now, bool(buffers)):
            sup.running = False
    _remove_own(path, bound, state_dir / PIDFILE)


def _remove_own(path: Path, inode: int, pidfile: Path) -> None:
    """Remove the socket and pid file, unless a newer supervisor has made its own meanwhile."""
    with contextlib.suppress(OSError):
        if path.stat().st_ino == inode:
            path.unlink()
    with contextlib.suppress(OSError, ValueError):
        if int(pidfile.read_text()) == os.getpid():
            pidfile.unlink()


def _child_wakeup() -> socket.socket:
    """A socket that turns readable whenever a child exits (SIGCHLD through the wakeup fd)."""
    reader, writer = socket.socketpair()
    for sock in (reader, writer):
        sock.setblocking(False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _WAKEUP.append(writer)  # open for the life of the process
    return reader


def _read(
    sup: Supervisor, sel: selectors.BaseSelector, conn: socket.socket, buffers: dict[Any, bytes]
) -> None:
    try:
        data = conn.recv(1 << 16)
    except OSError:
        data = b""
    if not data:
        sel.unregister(conn)
        buffers.pop(conn, None)
        if conn in sup.watchers:
            sup.watchers.remove(conn)
        conn.close()
        return
    *lines, buffers[conn] = (buffers[conn] + data).split(b"\n")
    for line in lines:
        try:
            reply = sup.handle(conn, json.loads(line))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fleet-supervisor")
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("--margin", type=float, required=True, help="seconds before the lease expires")
    parser.add_argument("--tick", type=float, default=0.05)
    parser.add_argument("--idle-exit", type=float, default=300.0, help="exit once idle this long (seconds)")
    parser.add_argument("--cgroup", type=Path, action="append", default=[], help="a node's attempt cgroups")
    args = parser.parse_args(argv)
    # until serve() handles SIGTERM (an idle supervisor exits; one holding attempts keeps them)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    serve(args.state_dir, args.margin, args.tick, args.idle_exit, args.cgroup)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
