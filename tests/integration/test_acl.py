"""Each service logs in to Redis as its own ACL user (config/users.acl), limited to fleet's keys and
to the commands fleet sends; the default user is off; no password shows in argv, environment or logs.

A real redis-server loads the shipped ACL file (passwords set by fleet.ops.install.render_acl, as
``fleet install redis`` does); the controller and agent are real child processes.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet import Client, JobSpec, JobState
from fleet.errors import ApiUnavailable
from fleet.keys import Keys
from fleet.models import Role
from fleet.ops.install import ACL_USERS, render_acl
from fleet.ops.local import free_port
from fleet.state.tokens import TokenStore
from tests.conftest import FleetProcs, need
from tests.support import redis_once, wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
#: one password per user, each holding characters a URL would misread
PASSWORDS = {user: f"{user}-p@ss/w#rd:{i}" for i, user in enumerate(ACL_USERS)}


class AclRedis:
    """A redis-server started with config/users.acl and test passwords."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-test-acl-"))
        acl = self.dir / "users.acl"
        acl.write_text(render_acl((REPO / "config" / "users.acl").read_text(), PASSWORDS))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        binary = shutil.which("redis-server") or "redis-server"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--aclfile",
                str(acl),
            ],
            stdout=subprocess.DEVNULL,
        )
        self.admin, self.bus_admin = self.client("fleet-admin"), self.client("fleet-admin", db=1)
        for _ in range(100):
            try:
                self.admin.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)

    def client(self, user: str, db: int = 0) -> redis.Redis:
        return redis.Redis(
            port=self.port, db=db, username=user, password=PASSWORDS[user], decode_responses=True
        )

    def password_file(self, user: str) -> Path:
        path = self.dir / f"{user}.password"
        path.touch(mode=0o600)
        path.write_text(PASSWORDS[user] + "\n")
        return path

    def close(self) -> None:
        self.admin.close()
        self.bus_admin.close()
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def acl_redis() -> Iterator[AclRedis]:
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    server = AclRedis()
    yield server
    server.close()


@pytest.fixture
def acl_procs(acl_redis: AclRedis, tmp_path: Path) -> Iterator[FleetProcs]:
    procs = FleetProcs(acl_redis.url, tmp_path, "process")
    yield procs
    procs.stop()


def login(acl_redis: AclRedis, user: str) -> dict[str, str]:
    """A service's environment: its username, and its password in a file (as systemd's LoadCredential)."""
    return {"FLEET_REDIS_USERNAME": user, "FLEET_REDIS_PASSWORD_FILE": str(acl_redis.password_file(user))}


def test_services_run_a_job_as_their_own_acl_users(acl_redis: AclRedis, acl_procs: FleetProcs) -> None:
    # Given a controller (serving metrics), an agent and the API, each logged in as its own Redis user,
    # and a client of the API with a token (no Redis credential at all); the bus remembers a process
    # that died (dramatiq's maintenance, which each service runs on its first fetch, looks for what it held)
    acl_redis.bus_admin.zadd("fleet:__heartbeats__", {"a-dead-broker": 0})
    metrics_port = free_port()
    controller = acl_procs.start(
        "controller",
        ["controller"],
        FLEET_CONTROLLER__METRICS_PORT=str(metrics_port),
        **login(acl_redis, "fleet-controller"),
    )
    agent = acl_procs.agent("acl-1", gpus=1, **login(acl_redis, "fleet-agent"))
    api_port = free_port()
    api = acl_procs.start("api", ["api", "--port", str(api_port)], **login(acl_redis, "fleet-api"))
    token, _ = TokenStore(acl_redis.admin, Keys()).create("tester", "default", Role.ADMIN)
    client = Client(f"http://127.0.0.1:{api_port}", token)
    try:
        wait_for(lambda: _answers(client), timeout=30, what="the API answering")
        acl_procs.wait_nodes(client, 1)
        # When a job is submitted, placed, run and reported through the bus and the state store
        job = client.submit(JobSpec(name="acl", command=["sh", "-c", "echo hello; env"], gpus=1))
        status = job.wait(timeout=60)
        # Then it succeeds, and the controller's metrics read Redis' memory (INFO, its one extra)
        assert status.state == JobState.SUCCEEDED, acl_procs.logs()
        assert job.logs().startswith("hello")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
            assert "fleet_redis_memory_bytes " in page.read().decode()
        # And Redis refused none of what the services sent (its ACL log is empty), the agent's
        # allocation of the tenant's job uid included
        assert acl_redis.admin.acl_log() == [], acl_procs.logs()
        assert acl_redis.admin.hgetall("fleet:job_uids") == {"default": "0"}
        assert acl_redis.bus_admin.zscore("fleet:__heartbeats__", "a-dead-broker") is None
        # And each service is connected as its own user, in the state DB and in the bus DB
        users = {(c["user"], c["db"]) for c in acl_redis.admin.client_list()}
        for user in ("fleet-controller", "fleet-agent", "fleet-api"):
            assert {(user, "0"), (user, "1")} <= users, users
        # And no password is on a service's command line, in its environment, in its logs or the job's
        passwords = [pw.encode() for pw in PASSWORDS.values()]
        supervisor = int((acl_procs.root / "acl-1" / "supervisor.pid").read_text())
        for pid in (controller.pid, agent.pid, api.pid, supervisor):
            seen = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
            assert not [pw for pw in passwords if pw in seen], pid
        assert not [pw for pw in passwords if pw in (acl_procs.logs() + job.logs()).encode()]
    finally:
        client.close()


def _answers(client: Client) -> bool:
    try:
        client.whoami()
        return True
    except ApiUnavailable:
        return False


def test_an_agent_user_cannot_administer_redis_nor_touch_other_keys(acl_redis: AclRedis) -> None:
    # Given fleet data, and a connection as the agent's user
    acl_redis.admin.set("fleet:seq", 7)
    acl_redis.admin.set("other:app", "theirs")
    agent = acl_redis.client("fleet-agent")
    # When it tries what only an administrator may do, in the state DB and in the bus DB
    forbidden = [
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("CONFIG", "GET", "*"),
        ("CONFIG", "SET", "appendonly", "no"),
        ("KEYS", "*"),
        ("ACL", "LIST"),
        ("ACL", "SETUSER", "fleet-agent", "+@all"),
        ("SAVE",),
        ("SHUTDOWN", "NOSAVE"),
        ("SCRIPT", "FLUSH"),
        ("FUNCTION", "FLUSH"),
        ("MONITOR",),
        ("CLIENT", "KILL", "TYPE", "normal"),
        ("SWAPDB", "0", "1"),
        ("REPLICAOF", "10.0.0.1", "6379"),
    ]
    bus = acl_redis.client("fleet-agent", db=1)
    for command in forbidden:
        for db in (agent, bus):
            with pytest.raises(redis.exceptions.NoPermissionError):
                db.execute_command(*command)
    bus.close()
    # Or reads and writes keys that are not fleet's, directly or from a script
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.get("other:app")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.eval("return redis.call('DEL', KEYS[1])", 1, "other:app")
    # Then Redis, its data and its users are as they were
    assert acl_redis.admin.get("fleet:seq") == "7" and acl_redis.admin.get("other:app") == "theirs"
    assert acl_redis.admin.config_get("appendonly") == {"appendonly": "no"}
    assert agent.incr("fleet:seq") == 8  # fleet's own keys it may change
    agent.close()


def test_the_default_user_is_off_and_wrong_passwords_are_refused(acl_redis: AclRedis) -> None:
    # Given Redis with the shipped ACL file: a client with no username (Redis' default user)
    anonymous = redis_once(port=acl_redis.port)
    # Then nothing it sends is served, with or without a password
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    for password in ("", "nopass", PASSWORDS["fleet-admin"]):
        with pytest.raises(redis.AuthenticationError):
            redis_once(port=acl_redis.port, password=password or None, username="default").ping()
    # And a service user is refused another user's password
    with pytest.raises(redis.AuthenticationError):
        redis_once(port=acl_redis.port, username="fleet-controller", password=PASSWORDS["fleet-agent"]).ping()
