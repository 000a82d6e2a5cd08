"""`fleet up`: a whole local fleet from one command, and nothing left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fleet import Client, JobHandle, JobState
from fleet.errors import StoreUnavailable
from tests.support import until

pytestmark = pytest.mark.integration


def test_fleet_up_demo_runs_jobs_to_completion_and_leaves_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "up", "--demo", "--runtime", "process", "--state-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"export FLEET_API_URL=http://127\.0\.0\.1:\d+ FLEET_TOKEN=fleet_\w+", done.stdout)
    rows = [line for line in done.stdout.splitlines() if line.startswith(("hello-", "two-gpus-", "flaky-"))]
    assert len(rows) == 3 and all(" SUCCEEDED " in r for r in rows), done.stdout
    leftovers = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


class Up:
    """`fleet up --runtime process` as a real subprocess, with its temp dir under ``root``.

    It remembers every process under it that the test looked at, so that the teardown can kill
    them even once `fleet up` is gone and they were reparented.
    """

    def __init__(self, root: Path) -> None:
        self.root, self.log = root, root / "up.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, psutil.Process] = {}

    def start(self, *options: str, **extra: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        env["TMPDIR"] = str(self.root)  # its fleet-up-* temp dir lands where the test can look
        env.update(extra)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleet", "up", "--runtime", "process", *options],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self.proc

    def wait_up(self, timeout: float = 60) -> Client:
        """A client of the API it prints once the agent registered, with the admin token it made."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(
                r"fleet is up.*?export FLEET_API_URL=(\S+) FLEET_TOKEN=(\S+)", self.output(), re.S
            )
            if found:
                return Client(found.group(1), found.group(2))
            assert self.proc.poll() is None, f"fleet up exited early:\n{self.output()}"
            time.sleep(0.1)
        raise AssertionError(f"fleet up did not come up in {timeout}s:\n{self.output()}")

    def descendants(self) -> list[psutil.Process]:
        assert self.proc is not None
        found = psutil.Process(self.proc.pid).children(recursive=True)
        self.seen.update((p.pid, p) for p in found)
        return found

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill_all(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in self.seen.values():
            if running(p):
                p.kill()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    fleet = Up(tmp_path)
    yield fleet
    fleet.kill_all()


def running(p: psutil.Process) -> bool:
    """Still running: a zombie has exited, whoever is left to reap it."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(procs: list[psutil.Process], within: float) -> list[list[str]]:
    """The command lines of those of ``procs`` that did not exit ``within`` seconds."""
    deadline = time.monotonic() + within
    while (alive := [p for p in procs if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p.cmdline() for p in alive if running(p)]


def role(p: psutil.Process) -> str:
    argv = p.cmdline()
    if "redis-server" in argv[0]:
        return "redis"
    if any(a.endswith("supervisor.py") for a in argv):
        return "supervisor"
    return next(a for a in argv if a in ("agent", "api", "controller"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_fleet_up_stopped_by_a_signal_stops_everything_it_started(up: Up, sig: signal.Signals) -> None:
    # Given `fleet up` running on its own temp dir, with its redis-server, controller, agent, API and
    # the node supervisor the agent started
    proc = up.start()
    up.wait_up()
    children = up.descendants()
    assert sorted(role(p) for p in children) == ["agent", "api", "controller", "redis", "supervisor"]

    # When it is sent the signal `kill`, systemd or a CI runner sends (or a closed terminal)
    proc.send_signal(sig)

    # Then it stops as Ctrl-C stops it: children stopped, temp dir removed, exit 0
    assert proc.wait(timeout=60) == 0, up.output()
    assert "stopping fleet" in up.output()
    assert still_running(children, within=1) == []
    assert list(up.root.glob("fleet-up-*")) == []


def test_fleet_up_under_nohup_outlives_a_hang_up_and_stops_on_sigterm(up: Up) -> None:
    # Given `fleet up` started as `nohup` starts it: SIGHUP ignored
    default = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        proc = up.start()
    finally:
        signal.signal(signal.SIGHUP, default)
    up.wait_up()
    # When its terminal hangs up
    proc.send_signal(signal.SIGHUP)
    # Then it runs on, as asked; and it still stops on SIGTERM, as it does from a terminal
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=2)
    assert "stopping fleet" not in up.output() and len(up.descendants()) == 5
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, up.output()
    assert list(up.root.glob("fleet-up-*")) == []


def test_fleet_up_killed_leaves_no_process_behind(up: Up) -> None:
    # Given `fleet up` running a job (a sleep, under the process runtime)
    proc = up.start()
    client = up.wait_up()
    try:
        client.submit({"name": "sleeper", "command": ["sleep", "300"]})
    finally:
        client.close()
    deadline = time.monotonic() + 60
    while ["sleep", "300"] not in [p.cmdline() for p in up.descendants()]:
        assert time.monotonic() < deadline, f"the job did not start:\n{up.output()}"
        time.sleep(0.1)
    started = up.descendants()  # redis-server, controller, agent, the node supervisor and the sleep

    # When it is SIGKILLed: no chance to stop anything itself
    proc.kill()
    proc.wait()

    # Then redis-server, controller, agent and the job all exit by themselves within seconds
    assert still_running(started, within=15) == [], up.output()


def test_fleet_ups_redis_admits_only_its_services(up: Up) -> None:
    # Given `fleet up` running, its jobs on the same machine as its redis-server (as the user who ran
    # it: under sudo, SUDO_USER; a root start would run them as root, who may read anything)
    up.start(SUDO_USER="nobody")
    client = up.wait_up()
    try:
        redis_proc = next(p for p in up.descendants() if role(p) == "redis")
        port = next(c.laddr.port for c in redis_proc.net_connections("tcp") if c.status == "LISTEN")
        (state,) = up.root.glob("fleet-up-*")
        # When a job tries Redis without the password, and to read the services' password file
        job = client.submit(
            {
                "name": "probe",
                "command": [
                    "sh",
                    "-c",
                    f"redis-cli -p {port} ping; cat {state}/redis.password || echo unreadable",
                ],
            }
        )
        status = job.wait(timeout=60)
        # Then Redis refuses it and the file is not the job's to read
        assert status.state == "SUCCEEDED", up.output()
        assert job.logs().splitlines()[0].startswith("NOAUTH"), job.logs()
        assert job.logs().splitlines()[-1] == "unreadable", job.logs()
        # And Redis listens on loopback alone, its password on no command line, its AOF private
        listening = {c.laddr.ip for c in redis_proc.net_connections("tcp") if c.status == "LISTEN"}
        assert listening == {"127.0.0.1"}
        password = (state / "redis.password").read_text().strip()
        assert not [p.pid for p in up.descendants() if password in " ".join(p.cmdline())]
        aof = [p for p in (state / "redis").rglob("*") if p.is_file()]
        assert aof and all(p.stat().st_mode & 0o077 == 0 for p in aof), aof
        assert (state / "redis").stat().st_mode & 0o077 == 0
    finally:
        client.close()


def test_fleet_up_ha_follows_a_failover_of_its_redis_with_nothing_restarted(up: Up) -> None:
    # Given `fleet up --ha`: a primary, two replicas and three sentinels, and a job that ran
    up.start("--ha")
    client = up.wait_up()
    try:
        assert client.submit(HELLO).wait(timeout=60).state == JobState.SUCCEEDED
        services = {(role(p), p.pid) for p in up.descendants() if role(p) != "redis"}
        assert len([p for p in up.descendants() if role(p) == "redis"]) == 6
        # And no password on any command line, the sentinels' config files private
        (state,) = up.root.glob("fleet-up-*")
        passwords = [(state / f).read_text().strip() for f in ("redis.password", "redis-sentinel.password")]
        assert not [p.pid for p in up.descendants() for pw in passwords if pw in " ".join(p.cmdline())]
        confs = list((state / "redis").glob("sentinel-*.conf"))
        assert len(confs) == 3 and all(c.stat().st_mode & 0o077 == 0 for c in confs)
        # When the primary is SIGKILLed, as fleet up says to see a failover
        found = re.search(r"To see a failover: kill -9 (\d+)", up.output())
        assert found, up.output()
        os.kill(int(found[1]), signal.SIGKILL)
        # Then a job submitted next runs to the end, on the services that were running
        job = until(lambda: _submitted(client), "a submit after the failover", timeout=60)
        assert job.wait(timeout=60).state == JobState.SUCCEEDED, up.output()
        assert {(role(p), p.pid) for p in up.descendants() if role(p) != "redis"} == services
        assert up.proc is not None and up.proc.poll() is None, up.output()
    finally:
        client.close()


HELLO = {"name": "hello", "command": ["echo", "hello"]}


def _submitted(client: Client) -> JobHandle | None:
    try:
        return client.submit(HELLO)
    except StoreUnavailable:  # the API answers 503 until the sentinels promote a replica
        return None
