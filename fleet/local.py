"""``fleet up``: a whole fleet on this machine, in the foreground, with nothing left behind.

It spawns its own ``redis-server`` on a free port (unless given a Redis URL), one controller and
one agent as child processes. The agent picks real GPUs (NVML) or simulated ones, and Docker or
the process runtime, as configured for ``auto``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from fleet.errors import ConfigError, FleetError

DEMO_JOBS: list[dict[str, Any]] = [
    {"name": "hello", "command": ["python3", "-c", "print('hello from fleet')"]},
    {"name": "two-gpus", "gpus": 2,
     "command": ["python3", "-c", "import os; print('my GPUs:', os.environ['CUDA_VISIBLE_DEVICES'])"]},
    {"name": "flaky", "gpus": 1, "max_attempts": 2,
     "command": ["python3", "-c",
                 "import os,sys; a=int(os.environ['FLEET_ATTEMPT']); print('attempt', a); sys.exit(a == 1)"]},
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalFleet:
    def __init__(self, *, gpus: int, runtime: str, state_dir: str | None, redis_url: str | None) -> None:
        self.gpus, self.runtime = gpus, runtime
        self._tmp = None if state_dir else tempfile.mkdtemp(prefix="fleet-up-")
        self.dir = Path(state_dir or self._tmp or ".").resolve()
        self.redis_url = redis_url
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def __enter__(self) -> LocalFleet:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not self.redis_url:
                self.redis_url = self._spawn_redis()
            env = self._env()
            self._spawn("controller", [sys.executable, "-m", "fleet.cli.main", "controller"], env)
            self._spawn("agent", [sys.executable, "-m", "fleet.cli.main", "agent"], env)
            self._wait_for_node()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        print(f"\nfleet is up. In another shell:\n\n  export FLEET_REDIS_URL={self.redis_url}\n"
              "  fleet submit --gpus 1 -- python3 -c 'print(42)'\n  fleet jobs\n\nCtrl-C stops it all.\n",
              flush=True)  # fmt: skip
        return self

    def _spawn_redis(self) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError(
                "redis-server not found: run `make install` (it installs it) or pass --redis-url"
            )
        port = free_port()
        data = self.dir / "redis"
        data.mkdir(exist_ok=True)
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
        self._spawn("redis", [*argv, "--appendonly", "yes", "--save", "", "--loglevel", "warning"], None)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                return url
            except redis.ConnectionError:
                time.sleep(0.05)
        raise FleetError(f"redis-server did not answer on port {port}")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            FLEET_REDIS_URL=self.redis_url or "",
            FLEET_CHECKPOINT_ROOT=str(self.dir / "checkpoints"),
            FLEET_AGENT__STATE_DIR=str(self.dir / "agent"),
            FLEET_AGENT__SIMULATED_GPUS=str(self.gpus),
            FLEET_AGENT__RUNTIME=self.runtime,
            FLEET_AGENT__STOP_JOBS_ON_EXIT="true",
            FLEET_RETRY_BACKOFF_S=env.get("FLEET_RETRY_BACKOFF_S", "1"),
        )
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None) -> None:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        self.children.append((name, proc))

    def _wait_for_node(self, timeout: float = 30) -> None:
        from fleet.client import Client

        client = Client(self.redis_url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_children()
            if any(n.alive for n in client.nodes()):
                client.close()
                return
            time.sleep(0.1)
        raise FleetError("the agent did not register within 30s; see its log above")

    def _check_children(self) -> None:
        for name, proc in self.children:
            if proc.poll() is not None:
                raise FleetError(f"{name} exited with code {proc.returncode}; see its log above")

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

        client = Client(self.redis_url)
        handles = [client.submit(spec) for spec in DEMO_JOBS]
        print(f"submitted {len(handles)} demo jobs; waiting for them ...", flush=True)
        finished = [h.wait(timeout=300) for h in handles]
        print()
        table(["JOB", "STATE", "ATTEMPTS", "NODE", "GPUS", "OUTPUT"],
              [(j.id, j.state.value, j.attempt, j.node, len(j.gpus), h.logs().replace("\n", " | "))
               for h, j in zip(handles, finished, strict=True)])  # fmt: skip
        client.close()
        return 0 if all(j.state == "SUCCEEDED" for j in finished) else 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for _name, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
