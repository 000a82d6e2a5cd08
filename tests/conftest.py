"""Shared fixtures: a real redis-server per session, real fleet processes, the real Docker daemon.

Integration tests skip when redis-server or Docker is missing locally and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.agent.cgroups import detect
from fleet.agent.supervisor import kill_leftovers
from fleet.api.backend import Backend
from fleet.client import Client, JobHandle
from fleet.config import Settings, load_settings
from fleet.keys import Keys
from fleet.models import JobSpec, Role
from fleet.ops.local import free_port
from fleet.state.tokens import TokenStore

IN_CI = os.environ.get("CI") == "true"
#: the tests' webhook receivers listen on 127.0.0.1, which an operator must allow (loopback is refused)
OPERATOR_ALLOWS = {
    "FLEET_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.1/32"]',
    # and the registries fleet ships with, plus the tests' own on 127.0.0.1 (any port)
    "FLEET_ALLOWED_REGISTRIES": '["localhost", "docker.io", "nvcr.io", "ghcr.io", "127.0.0.1"]',
}
TEST_IMAGE = "localhost/fleet/busybox:latest"


def need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        need(False, "torch not installed (make install installs torch==2.13.0, the CPU wheel)")


def need(condition: bool, why: str) -> None:
    if not condition:
        if IN_CI:
            pytest.fail(f"{why} (required under CI)")
        pytest.skip(why)


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, signed by nobody the system trusts (openssl, or a skip)."""
    need(shutil.which("openssl") is not None, "openssl not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True, timeout=60)  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    need(binary is not None, "redis-server not installed (make install)")
    assert binary is not None
    port = free_port()
    data = tempfile.mkdtemp(prefix="fleet-test-redis-")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            data,
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    yield url
    proc.terminate()
    proc.wait()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session's Redis, emptied before each test."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server


@pytest.fixture(name="redis")
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the state DB, to look at or tamper with what fleet stored."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def docker_ready() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.images.get(TEST_IMAGE)
        client.close()
        return True
    except Exception:
        return False


@pytest.fixture
def docker_runtime(docker_ready: bool) -> None:
    need(docker_ready, f"Docker daemon or the {TEST_IMAGE} image missing (make images-test)")


class FleetProcs:
    """Controllers and agents as real child processes, with fast test timings."""

    def __init__(self, redis_url: str, root: Path, runtime: str, api: Api | None = None) -> None:
        self.redis_url, self.root, self.runtime, self.api = redis_url, root, runtime, api
        self.cgroup_parent = f"fleet-test/{hashlib.sha256(str(root).encode()).hexdigest()[:16]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.nodes: set[str] = set()
        self.env = dict(os.environ)
        self.env.update(
            FLEET_REDIS_URL=redis_url,
            FLEET_CHECKPOINT_ROOT=str(root / "checkpoints"),
            FLEET_DEFAULT_IMAGE=TEST_IMAGE,
            FLEET_RETRY_BACKOFF_S="0.5",
            FLEET_CONTROLLER__SCHEDULE_INTERVAL_S="0.5",
            FLEET_CONTROLLER__LEADER_LEASE_S="2",
            FLEET_AGENT__HEARTBEAT_INTERVAL_S="0.25",
            FLEET_AGENT__NODE_LEASE_TTL_S="3",
            FLEET_AGENT__FENCE_MARGIN_S="0.5",
            # CPUs are scheduled (1 per CPU-only job by default): let a 2-core test machine's
            # simulated nodes take as many jobs as the tests give them
            FLEET_AGENT__CPUS="64",
            FLEET_AGENT__RECONCILE_INTERVAL_S="0.5",
            FLEET_AGENT__STOP_GRACE_S="2",
            FLEET_AGENT__DOCKER_PULL="never",
            FLEET_AGENT__GPUS="simulated",
            FLEET_AGENT__RUNTIME=runtime,
            # attempt cgroups of this fleet's own (node names repeat across tests run side by side),
            # and a default memory limit that does not shrink with the 64 CPUs above
            FLEET_AGENT__CGROUP_PARENT=self.cgroup_parent,
            FLEET_AGENT__DEFAULT_MEMORY="4g",
            FLEET_CONTROLLER__METRICS_PORT="0",
            FLEET_AGENT__METRICS_PORT="0",
            # the network guard changes the host's firewall for every job uid, and its rules outlive
            # the agent: tests/integration/test_hostile_network.py turns it on and removes it after
            FLEET_AGENT__JOB_NETWORK_GUARD="false",
            **OPERATOR_ALLOWS,
        )
        if runtime == "process" and not world_reachable(Path(sys.executable)):
            # jobs run this interpreter (torch is installed there); where it sits in a private home
            # the tenants' unprivileged uids cannot exec it. tests/integration/test_security.py and
            # test_hostile_node.py check the per-tenant uids with programs every user can run.
            self.env.update(FLEET_AGENT__JOB_USER="0:0", FLEET_AGENT__ALLOW_ROOT_JOBS="true")

    def settings(self) -> Settings:
        return load_settings(redis_url=self.redis_url)

    def cli_env(self, **extra: str) -> dict[str, str]:
        """Environment for a ``fleet`` command: the API and an admin token, no Redis credentials."""
        assert self.api is not None, "this fleet runs on a Redis of its own, with no API"
        return {**self.api.env(), **extra}

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", "fleet.cli.main", *argv], env={**self.env, **env},
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        log.close()
        self.procs[name] = proc
        return proc

    def controller(self, name: str = "controller") -> subprocess.Popen[bytes]:
        return self.start(name, ["controller"])

    def agent(self, node: str, gpus: int = 2, **env: str) -> subprocess.Popen[bytes]:
        self.nodes.add(node)
        return self.start(
            node, ["agent", "--node-name", node],
            FLEET_AGENT__SIMULATED_GPUS=str(gpus), FLEET_AGENT__STATE_DIR=str(self.root / node), **env,
        )  # fmt: skip

    def wait_nodes(self, client: Client, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(n.alive for n in client.nodes()) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"{count} nodes did not come up:\n{self.logs()}")

    def kill_node(self, node: str) -> None:
        """A machine losing power: the agent, its supervisor and every job process, SIGKILLed at once."""
        self.procs[node].send_signal(signal.SIGKILL)
        kill_supervisor(self.root / node)
        for meta in (self.root / node / "attempts").glob("*/meta.json"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(json.loads(meta.read_text())["pid"], signal.SIGKILL)
        self.procs[node].wait()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for state in self.root.glob("*/"):  # supervisors outlive agents on purpose
            kill_supervisor(state)
        for meta in self.root.glob("*/attempts/*/meta.json"):  # process-runtime jobs run in own sessions
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(json.loads(meta.read_text())["pid"], signal.SIGKILL)
        remove_cgroups(self.cgroup_parent)


def remove_cgroups(parent: str) -> None:
    """Kill what runs in the attempt cgroups under ``parent`` and remove them (a test's fleet)."""
    layout = detect()
    if layout.kind == "none":
        return
    tops = [m / parent for m in {*([layout.unified] if layout.unified else []), *layout.v1.values()}]
    nodes = [node for top in tops if top.is_dir() for node in top.iterdir() if node.is_dir()]
    kill_leftovers(nodes)
    for folder in sorted((p for top in tops if top.is_dir() for p in top.rglob("*") if p.is_dir()),
                         key=lambda p: -len(p.parts)):  # fmt: skip
        for _ in range(100):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.02)
    for top in tops:
        with contextlib.suppress(OSError):
            top.rmdir()


def world_reachable(path: Path) -> bool:
    """Whether any user may execute ``path``: every directory above it, and above what it links to
    (a venv's ``python`` links to the system's), searchable."""
    real = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents, *path.absolute().parents])


def kill_supervisor(state_dir: Path) -> None:
    """SIGKILL the node supervisor whose pid file is in ``state_dir`` (its jobs die with it)."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int((state_dir / "supervisor.pid").read_text()), signal.SIGKILL)


def remove_containers(*nodes: str) -> None:
    """Remove the containers these test nodes left (only theirs: another suite may share the daemon)."""
    try:
        import docker
    except ImportError:
        return
    try:
        client = docker.from_env(timeout=10)
        for c in client.containers.list(all=True, filters={"label": "fleet.node"}):
            if c.labels.get("fleet.node", "") in nodes:
                c.remove(force=True)
        client.close()
    except Exception:
        pass


@pytest.fixture(params=["process", "docker"])
def runtime(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_runtime")
    return str(request.param)


def _fleet(redis_url: str, runtime: str, root: Path, api: Api) -> Iterator[FleetProcs]:
    fleet = FleetProcs(redis_url, root, runtime, api)
    yield fleet
    fleet.stop()
    if runtime == "docker":
        remove_containers(*fleet.nodes)


@pytest.fixture(autouse=True)
def _reachable_tmp_path(request: pytest.FixtureRequest) -> None:
    """Jobs run as their tenant's unprivileged uid (``job_uid_range``): let them reach the test's
    directory, as they would reach an operator's checkpoint root. pytest makes its temp dirs
    private (0700); a test whose jobs write into a directory makes it 0777."""
    if "tmp_path" not in request.fixturenames:
        return
    path = request.getfixturevalue("tmp_path")
    path.chmod(0o755)
    for parent in list(path.parents)[:2]:
        with contextlib.suppress(PermissionError):
            parent.chmod(0o711)


@pytest.fixture
def procs(redis_url: str, runtime: str, tmp_path: Path, api: Api) -> Iterator[FleetProcs]:
    yield from _fleet(redis_url, runtime, tmp_path, api)


@pytest.fixture
def docker_procs(redis_url: str, docker_runtime: None, tmp_path: Path, api: Api) -> Iterator[FleetProcs]:
    """Services on the Docker runtime, for a module whose ``runtime`` is the process one."""
    yield from _fleet(redis_url, "docker", tmp_path, api)


@pytest.fixture(scope="session")
def api_server(redis_server: str) -> Iterator[str]:
    """One ``fleet api`` for the session, on its Redis: stateless, so a flush between tests is
    all a test needs (and a token made after it: ``api``)."""
    port = free_port()
    env = {**os.environ, "FLEET_REDIS_URL": redis_server, **OPERATOR_ALLOWS}
    argv = [sys.executable, "-m", "fleet", "api", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, f"fleet api exited with code {proc.returncode}"
            assert time.monotonic() < deadline, "fleet api did not listen within 30s"
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@dataclass
class Api:
    """The session's API and a token on it (admin of tenant ``default`` unless made otherwise)."""

    url: str
    redis_url: str
    token: str

    def env(self, token: str | None = None) -> dict[str, str]:
        """Environment for a ``fleet`` CLI process: the API and a token, and no Redis credentials."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_REDIS")}
        return {**env, "FLEET_API_URL": self.url, "FLEET_TOKEN": token or self.token}

    def token_for(self, user: str, tenant: str, role: str = "user", expires_in_s: float | None = None) -> str:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        token, _ = TokenStore(client, Keys()).create(user, tenant, Role(role), expires_in_s=expires_in_s)
        client.close()
        return token

    clients: list[Client] = field(default_factory=list)

    def client(self, token: str | None = None) -> Client:
        """A client with ``token`` (default: the admin's), closed when the test ends."""
        self.clients.append(Client(self.url, token or self.token))
        return self.clients[-1]


@pytest.fixture
def api(redis_url: str, api_server: str) -> Iterator[Api]:
    api = Api(api_server, redis_url, "")
    api.token = api.token_for("tester", "default", "admin")
    yield api
    for client in api.clients:
        client.close()


class DirectClient(Backend):
    """The backend on a Redis of the test's own (no API server there), handing out the Client's
    job handles: for tests of a fleet that runs on its own Redis (restarts, outages, chaos)."""

    def submit(self, spec: JobSpec | dict[str, Any], *, job_id: str | None = None) -> JobHandle:  # type: ignore[override]
        return JobHandle(self, super().submit(spec, job_id=job_id).id)  # type: ignore[arg-type]


@pytest.fixture
def client(api: Api) -> Iterator[Client]:
    c = api.client()
    yield c
    c.close()
