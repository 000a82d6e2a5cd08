"""The Redis of ``fleet up``: one ``redis-server``, or with ``--ha`` a primary, two replicas and three
sentinels, all on loopback, each on a free port, data in a 0700 folder.

Jobs run on this machine too (as another user): without a password any of them could reach Redis,
mint itself an admin token or ``CONFIG SET`` its way to a file written as this user. Each Redis has
a random password, given on its standard input (never argv, which ``ps`` shows) and to the services
in a 0600 file. Sentinels have their own: one a job could reach could name a Redis of the job's as
the primary, and every service would log in to it. A sentinel rewrites its config file, so that one
file (0600, in the 0700 folder) holds the passwords it needs.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from fleet.errors import ConfigError, FleetError

#: ``(name, argv, stdin text, umask)`` -> the started process
Spawn = Callable[[str, list[str], "str | None", int], "subprocess.Popen[bytes]"]
#: a Redis' port -> the port of what forwards to it (a proxy), which every other part dials instead
Front = Callable[[int], int]
#: how long a spawned redis-server may take to answer, and the sentinels to agree, before giving up
REDIS_START_S = 30.0
#: the name the sentinels know the primary by (``redis_master``)
MASTER = "fleet"
REPLICAS = 2
SENTINELS = 3


@dataclass(frozen=True)
class Timings:
    """How fast the sentinels fail over: the primary is down once it has not answered for
    ``down_after_ms``; a failover that stalls is tried again after ``failover_timeout_ms``. Short,
    for one machine, where a missed answer is a dead process rather than a busy network."""

    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000


@dataclass
class LocalRedis:
    """Where the services find the Redis that was started, and the processes it runs as."""

    url: str
    password_file: Path
    sentinels: list[str] = field(default_factory=list)
    sentinel_password_file: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def describe(self) -> str:
        """What ``fleet up --ha`` prints: where each part runs, and how to see a failover."""
        if not self.sentinels:
            return ""
        primary = self.procs["redis-0"]
        return (
            f"Redis Sentinel: primary {self.url.rsplit('/', 1)[0]} (pid {primary.pid}), {REPLICAS} replicas, "
            f"sentinels {' '.join(self.sentinels)}. To see a failover: kill -9 {primary.pid}\n"
        )

    def env(self) -> dict[str, str]:
        """``FLEET_REDIS_*`` for the services: addresses and the files holding the passwords."""
        env = {"FLEET_REDIS_URL": self.url, "FLEET_REDIS_PASSWORD_FILE": str(self.password_file)}
        if self.sentinels:
            env.update(FLEET_REDIS_SENTINELS=",".join(self.sentinels), FLEET_REDIS_MASTER=MASTER)
            env["FLEET_REDIS_SENTINEL_PASSWORD_FILE"] = str(self.sentinel_password_file)
        return env


def start(
    folder: Path, spawn: Spawn, *, ha: bool = False, timings: Timings = Timings(), front: Front | None = None
) -> LocalRedis:
    """Start Redis in ``folder`` (one server, or with ``ha`` the primary, replicas and sentinels)
    and return once it answers (and the sentinels know each other and the replicas).

    ``front``: each Redis is known to the replicas, the sentinels and the services by the port
    ``front(port)`` gives (``replica-announce-port``), a forwarder the caller runs: cutting it cuts
    that Redis off from all of them (the failover test's partitions)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ConfigError("redis-server not found: run `make install` (it installs it) or pass --redis-url")
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    password = _secret(folder.parent / "redis.password")
    ports = [free_port() for _ in range(1 + (REPLICAS if ha else 0))]
    known = [front(port) for port in ports] if front else ports
    found = LocalRedis(f"redis://127.0.0.1:{known[0]}/0", folder.parent / "redis.password")
    for n, port in enumerate(ports):
        data = folder / (f"redis-{n}" if ha else "")
        data.mkdir(mode=0o700, exist_ok=True)
        config = _server_config(port, data, password, known[0] if n else None)
        if front:
            config += f"replica-announce-ip 127.0.0.1\nreplica-announce-port {known[n]}\n"
        found.procs[f"redis-{n}" if ha else "redis"] = spawn("redis", [binary, "-"], config, 0o077)
    for port in ports:
        _wait_ping(redis.Redis(port=port, password=password), f"redis-server on port {port}")
    if ha:
        _wait_replicas(redis.Redis(port=ports[0], password=password))
        _start_sentinels(found, folder, binary, known[0], password, timings, spawn)
    return found


def _server_config(port: int, data: Path, password: str, primary: int | None) -> str:
    # masterauth on every one: the primary of today is a replica after a failover
    config = (
        f"port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {data}\nappendonly yes\n"
        f'save ""\nloglevel warning\nrequirepass {password}\nmasterauth {password}\n'
    )
    if primary is not None:
        config += f"replicaof 127.0.0.1 {primary}\n"
    # a replica's first sync at once, not after Redis' 5 s wait for other replicas to share it
    return config + "repl-diskless-sync-delay 0\n"


def _start_sentinels(
    found: LocalRedis, folder: Path, binary: str, primary: int, password: str, timings: Timings, spawn: Spawn
) -> None:
    found.sentinel_password_file = folder.parent / "redis-sentinel.password"
    own = _secret(found.sentinel_password_file)
    for n in range(SENTINELS):
        port = free_port()
        conf = folder / f"sentinel-{n}.conf"
        _private(conf, _sentinel_config(port, folder, primary, password, own, timings))
        found.procs[f"sentinel-{n}"] = spawn("sentinel", [binary, str(conf), "--sentinel"], None, 0o077)
        found.sentinels.append(f"127.0.0.1:{port}")
    for address in found.sentinels:
        _wait_agreed(redis.Redis(port=int(address.rpartition(":")[2]), password=own), address)


def _sentinel_config(port: int, folder: Path, primary: int, password: str, own: str, t: Timings) -> str:
    return (
        f"port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {folder}\nloglevel warning\n"
        f"requirepass {own}\nsentinel sentinel-pass {own}\n"
        f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\nsentinel auth-pass {MASTER} {password}\n"
        f"sentinel down-after-milliseconds {MASTER} {t.down_after_ms}\n"
        f"sentinel failover-timeout {MASTER} {t.failover_timeout_ms}\n"
    )


def _wait_agreed(client: redis.Redis, address: str) -> None:
    """Until the sentinel at ``address`` sees the other sentinels and the replicas: before, a
    failover could not reach its quorum, or would have no replica to promote."""

    def agreed() -> bool:
        state: dict[str, int] = client.sentinel_master(MASTER)  # type: ignore[assignment]
        return bool(state["num-other-sentinels"] >= SENTINELS - 1 and state["num-slaves"] >= REPLICAS)

    _wait(client, agreed, f"sentinel {address} (knowing the other sentinels and the replicas)")


def _wait_replicas(client: redis.Redis) -> None:
    """Until every replica has its first copy of the primary's data: promoted before, it has none."""

    def online() -> bool:
        info = client.info("replication")
        found = [info.get(f"slave{n}", {}).get("state") for n in range(REPLICAS)]
        return found == ["online"] * REPLICAS

    _wait(client, online, "the replicas' first sync")


def _wait_ping(client: redis.Redis, what: str) -> None:
    _wait(client, lambda: bool(client.ping()), what)


def _wait(client: redis.Redis, check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + REDIS_START_S  # a busy machine may take seconds
    try:
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except redis.ConnectionError:
                pass
            time.sleep(0.05)
    finally:
        client.close()
    raise FleetError(f"{what} did not answer in {REDIS_START_S:g} s")


def _secret(path: Path) -> str:
    """A new random password, written to ``path`` (0600)."""
    password = secrets.token_urlsafe(32)
    _private(path, password + "\n")
    return password


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


#: where :func:`free_port` picks from: below the kernel's ephemeral range (its usual first port)
PORTS_FROM = 10_000
_given: set[int] = set()


def free_port() -> int:
    """A port of 127.0.0.1 free now, for a server this process starts next (Redis, a sentinel, the
    API), never one it gave before. Picked below the kernel's ephemeral range
    (``ip_local_port_range``), from which every outgoing connection and every bind to port 0 takes
    its port: one of those could take a port picked there before its server binds it (seen: a
    forwarder on port 0 took the port just picked for a Redis, which then could not start)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200 if low - PORTS_FROM >= 1000 else 0):
        port = secrets.choice(range(PORTS_FROM, low))
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:  # an ephemeral range that starts low: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
