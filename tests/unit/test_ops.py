"""Bare-metal operation: sd_notify over a real datagram socket, `fleet install` into a root dir."""

from __future__ import annotations

import hashlib
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.agent import supervisor as server
from fleet.agent.supervision import SupervisorClient
from fleet.cli.main import main
from fleet.config import load_settings
from fleet.sdnotify import Notifier
from tests.conftest import need


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_notifier_speaks_the_systemd_protocol(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    notifier = Notifier(path)
    notifier.ready("node n1: 4 GPUs")
    notifier.watchdog()
    notifier.stopping()
    assert [sock.recv(256).decode() for _ in range(3)] == [
        "READY=1\nSTATUS=node n1: 4 GPUs",
        "WATCHDOG=1",
        "STOPPING=1",
    ]


def test_notifier_reaches_abstract_sockets_and_reads_the_watchdog_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0fleet-test-notify")
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", "@fleet-test-notify")
    notifier = Notifier()
    notifier.watchdog()
    assert sock.recv(64) == b"WATCHDOG=1"
    sock.close()


def test_notifier_without_systemd_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    Notifier().ready()  # no socket, no error


def test_install_writes_unit_config_and_a_private_secret(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text('s3"cret#x\n')
    argv = ["install", "agent", "--root", str(tmp_path), "--redis-url", "redis://10.0.0.5:6379/0"]
    assert main([*argv, "--redis-password-file", str(secret)]) == 0
    unit = (tmp_path / "etc/systemd/system/fleet-agent.service").read_text()
    dropin = (tmp_path / "etc/systemd/system/fleet-agent.service.d/redis.conf").read_text()
    config = tmp_path / "etc/fleet/fleet.toml"
    password = tmp_path / "etc/fleet/redis-agent.password"
    assert "Type=notify" in unit and "WatchdogSec=" in unit and "KillMode=process" in unit
    assert "ExecStart=/" in unit and " --config /etc/fleet/fleet.toml agent\n" in unit
    assert 's3"cret' not in config.read_text() + unit + dropin
    # the service gets its password as a file only it can read, and logs in as its own Redis user
    assert password.read_text() == 's3"cret#x\n' and stat.S_IMODE(password.stat().st_mode) == 0o600
    assert "LoadCredential=redis-password:/etc/fleet/redis-agent.password" in dropin
    assert (
        "FLEET_REDIS_USERNAME=fleet-agent" in dropin
        and "FLEET_REDIS_PASSWORD_FILE=%d/redis-password" in dropin
    )
    assert load_settings(config).redis_url == "redis://10.0.0.5:6379/0"
    assert main(["uninstall", "agent", "--root", str(tmp_path)]) == 0
    assert not (tmp_path / "etc/systemd/system/fleet-agent.service").exists() and config.exists()
    assert not (tmp_path / "etc/systemd/system/fleet-agent.service.d").exists()


def test_uninstall_agent_stops_its_node_supervisor_and_the_jobs_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an installed agent whose node supervisor (state_dir under the root) holds a running job
    assert main(["install", "agent", "--root", str(tmp_path)]) == 0
    state_dir = tmp_path / "var/lib/fleet/agent"
    state_dir.mkdir(parents=True)
    argv = [sys.executable, "-I", server.__file__, str(state_dir), "--margin", "1"]
    started = subprocess.Popen(argv, start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not (state_dir / "supervisor.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    supervisor = SupervisorClient(state_dir, margin_s=1.0)
    supervisor.lease(time.monotonic() + 600)
    job = supervisor.spawn("job-1.1", ["sleep", "600"], {}, str(tmp_path), None, None)
    supervisor.close()
    pid = int((state_dir / "supervisor.pid").read_text())
    assert pid == started.pid and running(job)
    capsys.readouterr()
    try:
        # When the operator uninstalls the agent
        assert main(["uninstall", "agent", "--root", str(tmp_path)]) == 0
        # Then the supervisor and its job are gone, and the command says so
        assert started.wait(timeout=10) == 0
        deadline = time.monotonic() + 10  # SIGKILLed by it on the way out: dead, if maybe not yet reaped
        while running(job) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not running(job)
        assert f"stopped the node supervisor (pid {pid}) and the jobs it held" in capsys.readouterr().out
        # And uninstalling again finds nothing to stop
        assert main(["uninstall", "agent", "--root", str(tmp_path)]) == 0
        assert "stopped" not in capsys.readouterr().out
    finally:  # a failure leaves no supervisor behind (its job dies with it)
        if started.poll() is None:
            started.kill()
            started.wait()


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_install_api_runs_the_api_as_its_own_redis_user(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    assert main(["install", "api", "--root", str(tmp_path), "--redis-password-file", str(secret)]) == 0
    unit = (tmp_path / "etc/systemd/system/fleet-api.service").read_text()
    dropin = (tmp_path / "etc/systemd/system/fleet-api.service.d/redis.conf").read_text()
    assert " --config /etc/fleet/fleet.toml api\n" in unit and "DynamicUser=yes" in unit
    assert "FLEET_REDIS_USERNAME=fleet-api" in dropin


def test_install_api_runs_the_api_in_the_storage_group_and_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the config's storage group (the default, fleet), the API's unit runs in it, with no
    # other privilege: still a dynamic user, no supplementary group but that one
    monkeypatch.delenv("FLEET_STORAGE_GROUP", raising=False)
    assert main(["install", "api", "--root", str(tmp_path)]) == 0
    unit = (tmp_path / "etc/systemd/system/fleet-api.service").read_text()
    groups = [line for line in unit.splitlines() if line.startswith("SupplementaryGroups=")]
    assert groups == ["SupplementaryGroups=fleet"] and "DynamicUser=yes" in unit and "@" not in unit
    assert "fleet-api reads kept outputs and checkpoints as group fleet" in capsys.readouterr().out
    # the agent's unit stays as it was (it runs as root), and says what it gives the group
    assert main(["install", "agent", "--root", str(tmp_path)]) == 0
    agent = (tmp_path / "etc/systemd/system/fleet-agent.service").read_text()
    assert "SupplementaryGroups" not in agent
    assert "fleet-agent gives kept outputs to group fleet" in capsys.readouterr().out
    # With none configured (storage_group = ""), the API's unit gets no group at all
    config = tmp_path / "etc/fleet/fleet.toml"
    config.write_text(config.read_text().replace('storage_group = "fleet"', 'storage_group = ""'))
    assert main(["install", "api", "--root", str(tmp_path)]) == 0
    unit = (tmp_path / "etc/systemd/system/fleet-api.service").read_text()
    assert "SupplementaryGroups" not in unit and "DynamicUser=yes" in unit


def test_install_redis_writes_users_with_generated_passwords_only_as_hashes(tmp_path: Path) -> None:
    # When an operator installs Redis' config
    assert main(["install", "redis", "--root", str(tmp_path)]) == 0
    etc = tmp_path / "etc/fleet"
    acl = (etc / "users.acl").read_text()
    # Then each user has a password of its own, in a 0600 file, and users.acl holds only its SHA-256
    for user in ("fleet-admin", "fleet-controller", "fleet-agent", "fleet-api"):
        file = etc / "redis-passwords" / f"{user}.password"
        password = file.read_text().rstrip("\n")
        assert len(password) >= 40 and stat.S_IMODE(file.stat().st_mode) == 0o600
        assert password not in acl
        assert f"user {user} on resetpass #{hashlib.sha256(password.encode()).hexdigest()} " in acl
    assert "user default off " in acl and stat.S_IMODE((etc / "users.acl").stat().st_mode) == 0o600
    assert "aclfile /etc/fleet/users.acl" in (etc / "redis.conf").read_text()
    # And a unit runs Redis with that config, its files private (UMask), as the user install found
    unit = (tmp_path / "etc/systemd/system/fleet-redis.service").read_text()
    assert " /etc/fleet/redis.conf --supervised systemd " in unit and "\nUMask=0077\n" in unit
    assert "@" not in unit.split("[Service]")[1].split("[Install]")[0]
    # And installing again keeps the users (services already use their passwords)
    assert main(["install", "redis", "--root", str(tmp_path)]) == 0
    assert (etc / "users.acl").read_text() == acl


def test_install_refuses_a_password_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an operator who puts the password into the URL (visible to every user in ps)
    argv = ["install", "agent", "--root", str(tmp_path), "--redis-url", "redis://:s3cret@10.0.0.5:6379/0"]
    # Then install refuses with a usage error naming the safe way, and writes nothing
    assert main(argv) == 2
    assert "--redis-password-file" in capsys.readouterr().err
    assert not (tmp_path / "etc/fleet/fleet.toml").exists()


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    need(shutil.which("systemd-analyze") is not None, "systemd-analyze missing (apt-get install systemd)")
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    for service in ("agent", "api", "controller"):
        assert main(["install", service, "--root", str(tmp_path), "--redis-password-file", str(secret)]) == 0
        # verify reads drop-ins from the system's folders only: check the unit with its own appended
        unit = tmp_path / f"etc/systemd/system/fleet-{service}.service"
        unit.write_text(unit.read_text() + (unit.parent / f"{unit.name}.d" / "redis.conf").read_text())
    assert main(["install", "redis", "--root", str(tmp_path)]) == 0
    units = sorted(str(p) for p in (tmp_path / "etc/systemd/system").glob("*.service"))
    assert ha_install(tmp_path / "ha", 6379) == 0  # its fleet-redis and fleet-redis-sentinel units
    units += sorted(str(p) for p in (tmp_path / "ha/etc/systemd/system").glob("*.service"))
    done = subprocess.run(
        ["systemd-analyze", "verify", *units],
        capture_output=True,
        text=True,
        env={"SYSTEMD_LOG_LEVEL": "warning", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "fleet-" not in done.stderr


@pytest.mark.parametrize("service", ["agent", "api", "controller"])
def test_each_units_command_line_is_one_the_cli_takes(tmp_path: Path, service: str) -> None:
    # Given the unit `fleet install` writes, when systemd runs its ExecStart (here with --help
    # added, so it parses the command line and stops): the CLI takes it (fleet's own --config
    # comes before the command; after it the CLI refuses with exit 2)
    assert main(["install", service, "--root", str(tmp_path)]) == 0
    unit = (tmp_path / f"etc/systemd/system/fleet-{service}.service").read_text()
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    words = exec_start.split()
    args = words[words.index("--config") :]  # after the executable (a path, or python -m fleet)
    assert args[-1] == service
    assert main([*args, "--help"]) == 0


def ha_install(root: Path, port: int, *extra: str) -> int:
    """``fleet install redis --sentinel`` of one of three hosts on 10.0.0.1-3 (the primary's on .1)."""
    argv = ["install", "redis", "--sentinel", "--root", str(root), "--address", f"10.0.0.{port - 6378}"]
    argv += ["--port", "6379", "--primary", "10.0.0.1", "--sentinels", "10.0.0.1,10.0.0.2,10.0.0.3"]
    return main([*argv, *extra])


def test_install_redis_sentinel_replicas_share_the_primarys_users_and_keep_rewritten_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    primary, replica = tmp_path / "a", tmp_path / "b"
    # Given a replica's host the primary's users were not copied to: refused, naming what to copy
    assert ha_install(replica, 6380) == 2
    assert "copy its /etc/fleet/users.acl and /etc/fleet/redis-passwords/" in capsys.readouterr().err
    assert not (replica / "etc/fleet/redis").exists()
    # When the primary's host is installed, then the replica's with its users and passwords
    assert ha_install(primary, 6379) == 0
    shutil.copytree(primary / "etc/fleet", replica / "etc/fleet", dirs_exist_ok=True)
    shutil.rmtree(replica / "etc/fleet/redis")
    assert ha_install(replica, 6380) == 0
    # Then the replica follows the primary, logged in as fleet-replica, and its sentinel watches it
    ha = replica / "etc/fleet/redis"
    conf, sentinel = (ha / "redis.conf").read_text(), (ha / "sentinel.conf").read_text()
    replication = (primary / "etc/fleet/redis-passwords/fleet-replica.password").read_text().strip()
    assert "\nreplicaof 10.0.0.1 6379\n" in conf and f"\nmasterauth {replication}\n" in conf
    assert "\nbind 10.0.0.2 127.0.0.1 -::1\n" in conf and "\nappendfsync always\n" in conf
    assert "\nreplicaof " not in (primary / "etc/fleet/redis/redis.conf").read_text()
    assert "\nsentinel monitor fleet 10.0.0.1 6379 2\n" in sentinel
    assert "\nsentinel auth-user fleet fleet-sentinel\n" in sentinel
    for path in (ha, ha / "redis.conf", ha / "sentinel.conf"):
        assert stat.S_IMODE(path.stat().st_mode) in (0o600, 0o700), path
    units = replica / "etc/systemd/system"
    assert "ReadWritePaths=/etc/fleet/redis\n" in (units / "fleet-redis.service").read_text()
    assert (
        " /etc/fleet/redis/sentinel.conf --sentinel " in (units / "fleet-redis-sentinel.service").read_text()
    )
    # And installing again keeps what Redis and Sentinel rewrote since (the primary after a failover)
    (ha / "sentinel.conf").write_text(sentinel.replace("10.0.0.1 6379 2", "10.0.0.3 6379 2"))
    assert ha_install(replica, 6380) == 0
    assert "\nsentinel monitor fleet 10.0.0.3 6379 2\n" in (ha / "sentinel.conf").read_text()
    assert f"kept {ha / 'sentinel.conf'}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--primary", "10.0.0.1;x"], "--primary: '10.0.0.1;x:6379' is not host or host:port"),
        (
            ["--sentinels", "10.0.0.2,10.0.0.3"],
            "--sentinels: lists no sentinel on this host (10.0.0.1:26379)",
        ),
        (["--quorum", "4"], "--quorum: 4 is not between 1 and the 3 sentinels listed"),
    ],
)
def test_install_redis_sentinel_names_a_bad_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str
) -> None:
    assert ha_install(tmp_path, 6379, *extra) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "etc").exists()


def test_install_service_with_the_sentinels_password(tmp_path: Path) -> None:
    secret = tmp_path / "sentinel.password"
    secret.write_text("s3ntinel\n")
    argv = ["install", "controller", "--root", str(tmp_path), "--redis-sentinel-password-file", str(secret)]
    assert main(argv) == 0
    dropin = (tmp_path / "etc/systemd/system/fleet-controller.service.d/redis.conf").read_text()
    copy = tmp_path / "etc/fleet/redis-sentinel-controller.password"
    assert copy.read_text() == "s3ntinel\n" and stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert "LoadCredential=redis-sentinel-password:/etc/fleet/redis-sentinel-controller.password" in dropin
    assert "Environment=FLEET_REDIS_SENTINEL_PASSWORD_FILE=%d/redis-sentinel-password" in dropin
    assert "s3ntinel" not in dropin
