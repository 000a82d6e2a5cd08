"""Helpers the tests share (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.procs import FleetProcs, until
from fleet.models import JobSpec
from fleet.ops.local import free_port


def sh(name: str, script: str, **fields: object) -> JobSpec:
    """A job of ``sh -c script`` that makes one attempt (a failure ends it), with ``fields``."""
    return JobSpec.parse({"name": name, "command": ["sh", "-c", script], "max_attempts": 1, **fields})


def wait_for(
    condition: Callable[[], object],
    timeout: float = 60,
    what: str = "condition",
    procs: FleetProcs | None = None,
) -> None:
    """Return once ``condition()`` is true; fail after ``timeout`` seconds naming ``what`` (and, given
    the fleet, with its services' logs)."""
    try:
        until(condition, what, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}" + (f"\n{procs.logs()}" if procs else "")) from None


def start_api(procs: FleetProcs, name: str, **popen: Any) -> str:
    """An API of the fleet's own (``popen``: the user and groups it runs as); its URL once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", "fleet.cli.main", "api", "--port", str(port), "--log-level", "warning"]
    with open(procs.root / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, env=procs.env, stdout=log, stderr=subprocess.STDOUT, **popen)
    procs.procs[name] = proc
    try:
        return listening(proc, port, "fleet api")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{procs.logs()}") from None


def listening(proc: subprocess.Popen[Any], port: int, what: str, timeout: float = 30) -> str:
    """The URL of ``proc``'s server on ``port`` once it accepts connections; fail naming ``what``
    if it exits first or does not listen within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return f"http://127.0.0.1:{port}"
        except OSError:
            assert proc.poll() is None, f"{what} exited with code {proc.returncode}"
            assert time.monotonic() < deadline, f"{what} did not listen within {timeout}s"
            time.sleep(0.05)


def stop(proc: subprocess.Popen[Any]) -> None:
    """End ``proc`` if it still runs (SIGKILL), reap it and close its pipes: what a test does in its
    ``finally`` so that a failed assertion leaves no process behind it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def redis_once(**options: Any) -> redis.Redis:
    """A Redis client that asks once: redis-py retries a refused login 3 times with backoff (~3 s
    each time), as it retries every ConnectionError, AuthenticationError among them."""
    return redis.Redis(retry=Retry(NoBackoff(), 0), **options)
