"""``fleet up``: a whole fleet on this machine, in the foreground, with nothing left behind.

It spawns its own ``redis-server`` on a free port (unless given a Redis URL; with ``--ha`` a primary,
two replicas and three sentinels: :mod:`fleet.ops.redis_local`), one controller, one agent and the
API as child processes. The agent picks real GPUs (NVML) or simulated ones, and Docker or
the process runtime, as configured for ``auto``.

Ctrl-C, SIGTERM (``kill``, systemd, CI runners) and SIGHUP (a closed terminal) all stop it the same
way: each child gets SIGTERM and time to stop (the agent stops its jobs), then the network guard its
Docker agent put on the host comes off (unless another agent of the host uses it), then the temp
dir goes.
Should ``fleet up`` die without that chance (SIGKILL, a crash), the kernel sends each child SIGTERM
(Linux's parent-death signal), so nothing outlives it.

Its jobs run as whoever started it (``SUDO_USER`` under sudo): one person's machine, their files.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from fleet.errors import ConfigError, FleetError
from fleet.ops import redis_local
from fleet.ops.redis_local import LocalRedis, free_port

DEMO_JOBS: list[dict[str, Any]] = [
    {"name": "hello", "command": ["python3", "-c", "print('hello from fleet')"]},
    {
        "name": "two-gpus",
        "gpus": 2,
        "command": ["python3", "-c", "import os; print('my GPUs:', os.environ['CUDA_VISIBLE_DEVICES'])"],
    },
    {
        "name": "flaky",
        "gpus": 1,
        "max_attempts": 2,
        "command": [
            "python3",
            "-c",
            "import os,sys; a=int(os.environ['FLEET_ATTEMPT']); print('attempt', a); sys.exit(a == 1)",
        ],
    },
]


#: Signals that stop ``fleet up`` as Ctrl-C (SIGINT) does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_Handler = Callable[[int, Any], Any] | int | None


def jobs_run_as(environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The agent settings that run ``fleet up``'s jobs as the person who started it (``SUDO_USER``'s
    uid and gid under sudo, else this process's own), and a line to print when that is root. An
    ``agent.job_user`` given in the environment is kept."""
    if "FLEET_AGENT__JOB_USER" in environ:
        return {}, ""
    sudo = environ.get("SUDO_USER", "")
    if os.geteuid() == 0 and sudo not in ("", "root"):
        try:
            entry = pwd.getpwnam(sudo)
        except KeyError:
            raise ConfigError(
                f"SUDO_USER={sudo!r} names no user of this machine, and fleet up runs its "
                "jobs as the user who started it: unset SUDO_USER, or set "
                "FLEET_AGENT__JOB_USER=uid:gid"
            ) from None
        uid, gid = entry.pw_uid, entry.pw_gid
    else:
        uid, gid = os.getuid(), os.getgid()
    settings = {"FLEET_AGENT__JOB_USER": f"{uid}:{gid}"}
    if 0 in (uid, gid):
        settings["FLEET_AGENT__ALLOW_ROOT_JOBS"] = "true"
    note = (
        (
            "fleet up: started by root, so its jobs run as root; start it from your own account (or "
            "with sudo from it) to run them as you\n"
        )
        if uid == 0
        else ""
    )
    return settings, note


def _libc_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, or None off Linux: children then rely on an orderly stop alone."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the kernel sends the child SIGTERM once this process dies,
    even by SIGKILL; None where that is not available.

    The kernel fires it when the *thread* that forked exits, not the process: spawn from a thread
    that lives as long as the children should (``LocalFleet`` spawns from the thread that enters
    it, which is the one that leaves it). prctl is looked up here: between fork and exec the
    child should do as little as possible.
    """
    prctl = _libc_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl: no signal will ever come
            os._exit(128 + signal.SIGTERM)

    return preexec


class LocalFleet:
    def __init__(
        self, *, gpus: int, runtime: str, state_dir: str | None, redis_url: str | None, ha: bool = False
    ) -> None:
        if ha and redis_url:
            raise ConfigError(
                "--ha starts a Redis of its own (primary, replicas, sentinels): drop --redis-url"
            )
        self.gpus, self.runtime, self.ha = gpus, runtime, ha
        self._tmp = None if state_dir else tempfile.mkdtemp(prefix="fleet-up-")
        self.dir = Path(state_dir or self._tmp or ".").resolve()
        self.redis_url = redis_url
        self.redis: LocalRedis | None = None
        self._lost: set[int] = set()  # pids of Redis processes of --ha that exited
        self.api_url, self.token = "", ""
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._handlers: dict[int, _Handler] = {}
        self._preexec = die_with_parent()
        self._jobs_user, self._note = jobs_run_as(os.environ)

    def __enter__(self) -> LocalFleet:
        # default_int_handler raises KeyboardInterrupt: the path Ctrl-C takes, during start-up too
        self._redirect(STOP_SIGNALS, signal.default_int_handler)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if self._tmp:  # 0700 as made: let the jobs' user reach its work and checkpoint dirs in it
                self.dir.chmod(0o711)
            if self._note:
                print(self._note, end="", flush=True)
            if not self.redis_url:
                self.redis = redis_local.start(self.dir / "redis", self._spawn_redis, ha=self.ha)
            env = self._env()
            self._spawn("controller", [sys.executable, "-m", "fleet.cli.main", "controller"], env)
            self._spawn("agent", [sys.executable, "-m", "fleet.cli.main", "agent"], env)
            port = free_port()
            self._spawn("api", [sys.executable, "-m", "fleet.cli.main", "api", "--port", str(port)], env)
            self.api_url, self.token = f"http://127.0.0.1:{port}", self._admin_token()
            self._wait_for_node()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        ha = self.redis.describe() if self.redis else ""
        print(
            f"\n{ha}fleet is up: API {self.api_url}, status page {self.api_url}/ui (log in with the token), "
            "with an admin token for you. In another shell:\n\n"
            f"  export FLEET_API_URL={self.api_url} FLEET_TOKEN={self.token}\n"
            "  fleet submit --gpus 1 -- python3 -c 'print(42)'\n  fleet jobs\n\nCtrl-C stops it all.\n",
            flush=True,
        )
        return self

    def _admin_token(self) -> str:
        """A token for whoever ran ``fleet up``: admin of this fleet, jobs in tenant ``default``."""
        from fleet.config import from_env, load_settings
        from fleet.models import Role
        from fleet.state import Stores

        settings = load_settings(**from_env(self._redis_env()))
        stores = Stores.open(settings)
        user = os.environ.get("USER") or "admin"
        token, _ = stores.tokens.create(user, "default", Role.ADMIN, created_by="fleet up")
        stores.close()
        return token

    def _redis_env(self) -> dict[str, str]:
        """The services' ``FLEET_REDIS_*``: the Redis it spawned, with the files of its passwords."""
        return self.redis.env() if self.redis else {"FLEET_REDIS_URL": self.redis_url or ""}

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            **self._redis_env(),
            FLEET_CHECKPOINT_ROOT=str(self.dir / "checkpoints"),
            FLEET_AGENT__STATE_DIR=str(self.dir / "agent"),
            FLEET_AGENT__SIMULATED_GPUS=str(self.gpus),
            FLEET_AGENT__RUNTIME=self.runtime,
            FLEET_AGENT__STOP_JOBS_ON_EXIT="true",
            FLEET_RETRY_BACKOFF_S=env.get("FLEET_RETRY_BACKOFF_S", "1"),
            **self._jobs_user,
        )
        # process-runtime jobs get the agent's PATH: fleet's own environment first, so `python3` in a
        # job is the one fleet runs on, with what it installed (torch for the README's example)
        here = str(Path(sys.executable).parent)
        if here not in env.get("PATH", "").split(os.pathsep):
            env["PATH"] = os.pathsep.join([here, *filter(None, [env.get("PATH")])])
        return env

    def _spawn_redis(
        self, name: str, argv: list[str], stdin: str | None, umask: int
    ) -> subprocess.Popen[bytes]:
        return self._spawn(name, argv, None, stdin=stdin, umask=umask)

    def _spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None,
        *,
        stdin: str | None = None,
        umask: int = -1,
    ) -> subprocess.Popen[bytes]:
        # own session: a terminal's Ctrl-C reaches only us, and we stop them in order (Redis last)
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            start_new_session=True,
            preexec_fn=self._preexec,
            umask=umask,
        )
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        self.children.append((name, proc))
        return proc

    def _wait_for_node(self, timeout: float = 30) -> None:
        from fleet.client import Client
        from fleet.errors import ApiUnavailable

        client = Client(self.api_url, self.token)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_children()
            with contextlib.suppress(ApiUnavailable):  # the API is still starting
                if any(n.alive for n in client.nodes()):
                    client.close()
                    return
            time.sleep(0.1)
        raise FleetError(
            "the agent did not register, or the API did not answer, within 30s; see the log above"
        )

    def _check_children(self) -> None:
        for name, proc in self.children:
            if proc.poll() is None or proc.pid in self._lost:
                continue
            spare = self.redis.procs.values() if self.ha and self.redis else ()
            if not any(proc is p for p in spare):
                raise FleetError(f"{name} exited with code {proc.returncode}; see its log above")
            # with --ha, a Redis or a sentinel going is what the others are there for
            self._lost.add(proc.pid)
            print(f"fleet up: a {name} exited with code {proc.returncode}; the rest carry on", flush=True)

    def serve(self) -> None:
        try:
            while True:
                self._check_children()
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping fleet ...", flush=True)

    def demo(self) -> int:
        from fleet.cli.output import table
        from fleet.client import Client

        client = Client(self.api_url, self.token)
        handles = [client.submit(spec) for spec in DEMO_JOBS]
        print(f"submitted {len(handles)} demo jobs; waiting for them ...", flush=True)
        finished = [h.wait(timeout=300) for h in handles]
        print()
        table(
            ["JOB", "STATE", "ATTEMPTS", "NODE", "GPUS", "OUTPUT"],
            [
                (j.id, j.state.value, j.attempt, j.node, len(j.gpus), h.logs().replace("\n", " | "))
                for h, j in zip(handles, finished, strict=True)
            ],
        )
        client.close()
        return 0 if all(j.state == "SUCCEEDED" for j in finished) else 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # a second Ctrl-C or SIGTERM must not cut the stop short and leave the temp dir behind
        self._redirect((signal.SIGINT, *STOP_SIGNALS), signal.SIG_IGN)
        try:
            self._stop_children()
            self._unguard()
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
        finally:
            self._restore_handlers()

    def _stop_children(self) -> None:
        for _name, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def _unguard(self) -> None:
        """Take off the network guard its agent ensured (Docker runtime: iptables chains, the
        fleet-jobs network), unless another agent of this host still uses it."""
        from fleet.agent import netguard

        if not (self.dir / "agent" / netguard.MARKER).exists():
            return
        try:
            done = netguard.release()
        except (netguard.GuardError, OSError, subprocess.SubprocessError) as exc:
            print(f"fleet up: the network guard was left on this host: {exc}", flush=True)
            return
        for line in done or ["left the network guard on: another agent of this host uses it"]:
            print(f"fleet up: {line}", flush=True)

    def _redirect(self, signals: Iterable[signal.Signals], handler: _Handler) -> None:
        """Handle ``signals`` with ``handler``, remembering the first handlers to restore them.

        A signal ignored on purpose (``nohup`` ignores SIGHUP) stays ignored. Only the main
        thread may set handlers; elsewhere the embedding program keeps its own.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in signals:
            previous = signal.getsignal(sig)
            if previous is not signal.SIG_IGN:
                signal.signal(sig, handler)
                self._handlers.setdefault(sig, signal.SIG_DFL if previous is None else previous)

    def _restore_handlers(self) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        self._handlers.clear()
