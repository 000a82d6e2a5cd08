"""Redis as ``fleet install redis`` sets it up (ACL users with passwords, AOF with fsync on every
write), restarted under a running fleet: nothing is lost.

Redis 7.0 replays its AOF as the ``default`` user; a default user with no permissions made every
replayed MULTI/EXEC (each Lua script's writes) fail with NOPERM, so a restart silently dropped most
of the fleet's state (Redis issue 14541). These tests run the exact files ``fleet install redis``
writes, changing only the two absolute paths (``dir``, ``aclfile``) to the test's folder.
"""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet import Client, JobSpec, JobState
from fleet.cli.main import main
from fleet.config import load_settings
from fleet.errors import StoreUnavailable
from fleet.keys import Keys
from fleet.models import Role
from fleet.ops.install import install_redis
from fleet.ops.local import free_port
from fleet.state import Stores
from fleet.state.tokens import TokenStore
from tests.conftest import FleetProcs, need
from tests.integration.test_acl import _answers
from tests.integration.test_control_plane import sleeper
from tests.support import redis_once, until, wait_for

pytestmark = pytest.mark.integration


class InstalledRedis:
    """redis-server run from the files ``fleet install redis --root`` wrote."""

    def __init__(self, root: Path) -> None:
        self.root = root
        _acl, folder, _unit = install_redis(root)
        assert folder is not None
        self.passwords = {p.stem: p for p in folder.glob("*.password")}
        self.data = root / "var" / "lib" / "fleet" / "redis"
        self.data.mkdir(parents=True)
        installed = (root / "etc" / "fleet" / "redis.conf").read_text()
        conf = installed.replace("\ndir /var/lib/fleet/redis\n", f"\ndir {self.data}\n").replace(
            "\naclfile /etc/fleet/users.acl\n", f"\naclfile {root}/etc/fleet/users.acl\n"
        )
        # the installed file, but for the two paths: what a restart replays is the shipped config's
        changed = set(conf.splitlines()) ^ set(installed.splitlines())
        assert len(changed) == 4, changed
        self.conf = root / "redis.conf"
        self.conf.write_text(conf)
        self.log = root / "redis.log"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        binary = shutil.which("redis-server") or "redis-server"
        argv = [binary, str(self.conf), "--port", str(self.port), "--logfile", str(self.log)]
        self.proc = subprocess.Popen(argv)
        admin = self.client("fleet-admin")
        wait_for(lambda: _pings(admin), timeout=30, what="redis-server answering")
        admin.close()

    def stop(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def client(self, user: str, db: int = 0) -> redis.Redis:
        password = self.passwords[user].read_text().strip()
        return redis.Redis(port=self.port, db=db, username=user, password=password, decode_responses=True)

    def login(self, user: str) -> dict[str, str]:
        """A service's environment, as the systemd drop-in ``fleet install SERVICE`` writes gives it."""
        return {"FLEET_REDIS_USERNAME": user, "FLEET_REDIS_PASSWORD_FILE": str(self.passwords[user])}


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.BusyLoadingError):
        return False


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[InstalledRedis]:
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    server = InstalledRedis(tmp_path / "root")
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.stop(signal.SIGKILL)


def snapshot(admin: redis.Redis) -> dict[str, object]:
    """What must survive: every job, its history and logs, every token and tenant, the queue."""
    kept: dict[str, object] = {}
    for key in sorted(admin.scan_iter("fleet:*", count=1000)):
        kind = admin.type(key)
        if key.startswith(("fleet:node", "fleet:leader", "fleet:metrics", "fleet:outbox", "fleet:webhooks")):
            continue  # rewritten by heartbeats, the leader's lease and its webhook sender as the fleet runs
        if kind == "hash":
            kept[key] = admin.hgetall(key)
        elif kind == "stream":
            kept[key] = [fields for _id, fields in admin.xrange(key)]
        else:
            kept[key] = kind
    return kept


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_redis_from_the_installed_files_restarts_with_nothing_lost(
    installed: InstalledRedis, tmp_path: Path, stop: signal.Signals
) -> None:
    # Given a fleet whose services log in as their own ACL users with the passwords install wrote
    procs = FleetProcs(installed.url, tmp_path / "fleet", "process")
    procs.root.mkdir()
    procs.start("controller", ["controller"], **installed.login("fleet-controller"))
    procs.agent("r-1", gpus=1, **installed.login("fleet-agent"))
    api_port = free_port()
    procs.start("api", ["api", "--port", str(api_port)], **installed.login("fleet-api"))
    admin = installed.client("fleet-admin")
    token, _ = TokenStore(admin, Keys()).create("tester", "default", Role.ADMIN)
    client = Client(f"http://127.0.0.1:{api_port}", token)
    try:
        wait_for(lambda: _answers(client), timeout=30, what="the API answering")
        procs.wait_nodes(client, 1)
        # with a job that ran, one running and one queued behind it
        done = client.submit(JobSpec(name="done", command=["sh", "-c", "echo kept"]))
        assert done.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
        running = client.submit(sleeper(8))
        wait_for(lambda: running.status().state == JobState.RUNNING, what="the job running")
        queued = client.submit(sleeper(0))
        # (and the controller's pass has written why it waits: the snapshot is of a fleet at rest)
        wait_for(
            lambda: (s := queued.status()).state == JobState.QUEUED and s.reason != "submitted",
            what="the job queued, its wait reason written",
        )
        before = snapshot(admin)
        admin.close()
        # When Redis stops (a restart, or a crash) and starts again from its AOF
        installed.stop(stop)
        installed.start()
        # Then every key the fleet wrote is there as it was, and Redis refused no replayed command
        admin = installed.client("fleet-admin")
        after = snapshot(admin)
        assert [k for k in before if k not in after] == []
        assert {k: v for k, v in before.items() if after[k] != v} == {}
        log = installed.log.read_text()
        assert "NOPERM" not in log and "CRITICAL" not in log, log[-3000:]
        # And the running job ran on undisturbed, the queued one after it, the token still works
        status = running.wait(timeout=60)
        assert (status.state, status.attempt, status.infra_requeues) == (JobState.SUCCEEDED, 1, 0), (
            procs.logs()
        )
        assert queued.wait(timeout=60).state == JobState.SUCCEEDED
        assert client.whoami().user == "tester"
        assert done.logs() == "kept"
        # And nothing but the fleet's users can log in: not the default user, not without a password
        with pytest.raises(redis.AuthenticationError):
            redis_once(port=installed.port).ping()
        assert admin.acl_log() == [], procs.logs()
    finally:
        client.close()
        admin.close()
        procs.stop()


class SentinelHost:
    """One Redis host of a Sentinel set, run from the files ``fleet install redis --sentinel --root``
    wrote: its Redis and its sentinel, each from its installed config with only the absolute paths
    (``dir``, ``aclfile``) moved under the host's root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "etc" / "fleet" / "redis"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        binary = shutil.which("redis-server") or "redis-server"
        for name, data, extra in (("redis", "redis", []), ("sentinel", "sentinel", ["--sentinel"])):
            conf = self.conf / f"{name}.conf"
            installed = conf.read_text()
            (self.root / data).mkdir(exist_ok=True)
            text = installed.replace(f"\ndir /var/lib/fleet/{data}\n", f"\ndir {self.root / data}\n")
            text = text.replace("\naclfile /etc/fleet/", f"\naclfile {self.root}/etc/fleet/")
            assert len(set(text.splitlines()) ^ set(installed.splitlines())) == (4 if name == "redis" else 2)
            conf.write_text(text)
            log = self.root / f"{name}.log"
            self.procs.append(subprocess.Popen([binary, str(conf), *extra, "--logfile", str(log)]))

    def password(self, name: str) -> str:
        return (self.root / "etc" / "fleet" / "redis-passwords" / f"{name}.password").read_text().strip()

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def _replicas_online(admin: redis.Redis, replicas: int) -> bool:
    info = admin.info("replication")
    return [info.get(f"slave{n}", {}).get("state") for n in range(replicas)] == ["online"] * replicas


def test_a_sentinel_set_from_the_installed_files_fails_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    # Given three Redis hosts installed as an operator would: the primary's first, then each replica's
    # with the primary's users.acl and passwords copied over
    ports, sentinel_ports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    listed = ",".join(f"127.0.0.1:{p}" for p in sentinel_ports)
    hosts = [SentinelHost(tmp_path / f"host-{n}") for n in range(3)]
    for n, host in enumerate(hosts):
        if n:
            (host.root / "etc" / "fleet").mkdir(parents=True)
            shutil.copy2(hosts[0].root / "etc/fleet/users.acl", host.root / "etc/fleet/users.acl")
            shutil.copytree(
                hosts[0].root / "etc/fleet/redis-passwords", host.root / "etc/fleet/redis-passwords"
            )
        argv = ["install", "redis", "--sentinel", "--root", str(host.root), "--address", "127.0.0.1"]
        argv += ["--port", str(ports[n]), "--primary", f"127.0.0.1:{ports[0]}", "--sentinels", listed]
        assert main([*argv, "--sentinel-port", str(sentinel_ports[n])]) == 0
        said = capsys.readouterr().out
        assert ("this Redis: primary" if n == 0 else f"replica of 127.0.0.1:{ports[0]}") in said
    # the lines the services' config needs, as printed
    quoted = ", ".join(f'"127.0.0.1:{p}"' for p in sentinel_ports)
    assert f"redis_sentinels = [{quoted}]" in said
    assert 'redis_master = "fleet"' in said
    # nothing secret is readable by others, and no password is in the printed lines
    for path in (*hosts[1].conf.iterdir(), hosts[1].root / "etc/fleet/users.acl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert hosts[0].password("sentinel") not in said
    try:
        # When their Redis and sentinels start
        for host in hosts:
            host.start()
        admin = redis.Redis(port=ports[0], username="fleet-admin", password=hosts[0].password("fleet-admin"))
        wait_for(
            lambda: _pings(admin) and _replicas_online(admin, 2), timeout=30, what="both replicas in sync"
        )
        admin.close()
        sentinel_password = hosts[0].password("sentinel")
        watchers = [redis.Redis(port=p, password=sentinel_password) for p in sentinel_ports]

        def agreed() -> bool:
            states = [w.sentinel_master("fleet") for w in watchers]
            return all(s["num-slaves"] == 2 and s["num-other-sentinels"] == 2 for s in states)

        wait_for(agreed, timeout=30, what="the sentinels knowing each other and both replicas")
        # And a fleet service finds the primary through them, with the printed settings
        monkeypatch.setenv("FLEET_REDIS_SENTINELS", listed)
        monkeypatch.setenv("FLEET_REDIS_USERNAME", "fleet-controller")
        monkeypatch.setenv(
            "FLEET_REDIS_PASSWORD_FILE",
            str(hosts[2].root / "etc/fleet/redis-passwords/fleet-controller.password"),
        )
        monkeypatch.setenv(
            "FLEET_REDIS_SENTINEL_PASSWORD_FILE",
            str(hosts[2].root / "etc/fleet/redis-passwords/sentinel.password"),
        )
        stores = Stores.open(load_settings())
        token, _ = stores.tokens.create("before", "default", Role.ADMIN)
        assert stores.redis.wait(2, 5000) == 2
        # And the primary is SIGKILLed
        hosts[0].procs[0].kill()
        # Then the sentinels, logged in to each Redis as fleet-sentinel, promote a replica, and the
        # other replica follows it
        promoted = until(lambda: _new_primary(watchers[1], ports[0]), "a replica promoted", timeout=60)
        assert promoted in ports[1:]
        # And each one's config says so, rewritten by Redis (CONFIG REWRITE): it survives a restart
        new, other = (hosts[1], hosts[2]) if promoted == ports[1] else (hosts[2], hosts[1])
        wait_for(
            lambda: f"replicaof 127.0.0.1 {promoted}" in (other.conf / "redis.conf").read_text(),
            timeout=30,
            what="the replica's config rewritten",
        )
        assert not [
            x for x in (new.conf / "redis.conf").read_text().splitlines() if x.startswith("replicaof")
        ]
        # And the service writes to the new primary, where the token made before is
        wait_for(lambda: _made_token(stores), timeout=30, what="a write through the sentinels")
        assert stores.tokens.identify(token) is not None
        stores.close()
        for w in watchers:
            w.close()
    finally:
        for host in hosts:
            host.stop()


def _new_primary(sentinel: redis.Redis, old: int) -> int | None:
    _host, port = sentinel.sentinel_get_master_addr_by_name("fleet")
    return int(port) if int(port) != old else None


def _made_token(stores: Stores) -> bool:
    try:
        stores.tokens.create("after", "default", Role.USER)
    except StoreUnavailable:
        return False
    return True
