"""Fixtures of the integration tests: a Redis primary, replicas and sentinels, as ``fleet up --ha``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.ops import redis_local
from fleet.ops.redis_local import LocalRedis
from tests.conftest import need


@pytest.fixture
def ha_timings() -> redis_local.Timings:
    """How fast the ``ha`` set's sentinels fail over: as ``fleet up --ha`` (a module may override)."""
    return redis_local.Timings()


@pytest.fixture
def ha(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ha_timings: redis_local.Timings
) -> Iterator[LocalRedis]:
    """A primary, two replicas and three sentinels (down after 1 s), as ``fleet up --ha`` runs them,
    with the ``FLEET_REDIS_*`` the services read set in the environment."""
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    started: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, argv: list[str], stdin: str | None, umask: int) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, umask=umask
            )
        assert proc.stdin is not None
        proc.stdin.write((stdin or "").encode())
        proc.stdin.close()
        started.append(proc)
        return proc

    try:
        found = redis_local.start(tmp_path / "redis", spawn, ha=True, timings=ha_timings)
        for name, value in found.env().items():
            monkeypatch.setenv(name, value)
        yield found
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def primary_port(ha: LocalRedis) -> int:
    """The port of the Redis the sentinels name primary now (the last sentinel's word)."""
    sentinel = ha.sentinels[-1].rpartition(":")[2]
    password = ha.sentinel_password_file.read_text().strip() if ha.sentinel_password_file else None
    with redis.Redis(port=int(sentinel), password=password, decode_responses=True) as client:
        _host, port = client.sentinel_get_master_addr_by_name(redis_local.MASTER)
    return int(port)
