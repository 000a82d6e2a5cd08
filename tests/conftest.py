"""Shared fixtures: a real redis-server per session, real fleet processes, the real Docker daemon.

Integration tests skip when redis-server or Docker is missing locally and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from bench.procs import OPERATOR_ALLOWS, TEST_IMAGE, FleetProcs, closed_above
from fleet.client import Client
from fleet.keys import Keys
from fleet.models import Role
from fleet.ops.local import free_port
from fleet.state.tokens import TokenStore
from tests.support import listening

IN_CI = os.environ.get("CI") == "true"
_FAILED = pytest.StashKey[bool]()


#: modules whose services run under fleet's default cgroup parent (``fleet up``; the hosts' units):
#: a supervisor starting there kills what another left in it, so they run one after another
DEFAULT_CGROUP_PARENT = {"test_up.py", "test_hosts.py"}


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker's fleets give their gangs' rank 0 ports (``MASTER_PORT``, bound on
    this host) from a range of the worker's own, so that two workers' gangs never meet.

    Ctrl-C reaches the commands the tests start as it does a user's: a pytest started where SIGINT
    is ignored (a background job of a script, some CI runners) hands that to every child, and a
    Python program that starts with SIGINT ignored never raises KeyboardInterrupt, so `fleet jobs
    --watch`, `fleet run` and `fleet shell` went on after the tests' Ctrl-C. With a handler here,
    the children start with SIGINT at its default (exec resets handled signals, not ignored ones).
    SIGHUP likewise, ignored under ``nohup``: `fleet up` keeps a SIGHUP ignored on purpose, so its
    test of stopping on SIGHUP hung, and so did a `fleet shell` command's hang-up."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:  # under nohup: pytest still outlives a
        # hang-up, and `fleet up` and the services start with SIGHUP as from a terminal
        signal.signal(signal.SIGHUP, lambda *_: None)
    # run as root, jobs run as their tenant's uid and start this interpreter: from a checkout under
    # /root (0700) six tests failed with "permission denied", far from the cause
    if os.geteuid() == 0 and (blocked := closed_above(Path(sys.executable))):
        raise pytest.UsageError(
            f"{blocked} is closed to other users (mode {blocked.stat().st_mode & 0o777:o}): the tests' "
            f"jobs run as unprivileged users and start {sys.executable}; make it searchable "
            f"(chmod o+x {blocked}) or put the checkout and its venv in a directory they can reach"
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):  # 50 ports each, past the default 29400-29899 (a serial run's) and
        # below the kernel's ephemeral ports (from 32768)
        os.environ["FLEET_CONTROLLER__RENDEZVOUS_PORTS"] = "50"
        os.environ["FLEET_CONTROLLER__RENDEZVOUS_PORT_BASE"] = str(29900 + 50 * int(worker[2:]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def _leftovers_of_a_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that failed midway can leave a process or file object that only the garbage collector
    finds, later, as a ResourceWarning (an error under ``filterwarnings = error``) in whichever
    test runs next on that worker. Collected here, in the failed test's own teardown, unreported:
    the failure is already its, and the next test is not blamed for it. (pytest keeps the failure's
    frames, so its objects, in ``sys.last_traceback`` until the next test's call: let them go.)"""
    yield
    if request.node.stash.get(_FAILED, False):
        for name in ("last_type", "last_value", "last_traceback"):
            with contextlib.suppress(AttributeError):
                delattr(sys, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``), tests that share something host-wide run on one worker,
    one after another (``--dist loadgroup``); the rest spread over the workers, each of which has
    a Redis, an API and temp dirs (so cgroup parents) of its own. Tests marked ``alone`` change
    the host for everyone and run in a pytest of their own (``-m alone``).

    xdist hands tests out in their order: the unit tests last, whose many short ones keep every
    worker busy until all end at about the same time, where a torch gang of a minute (tests/workers),
    last, would keep one running alone."""
    for item in items:
        if group := _shared(item):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.path.parent.name == "unit")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A group xdist did not take (its id has no ``@group``) would run beside its own kind on
    another worker: stop before any test runs (see the pytest bound in pyproject.toml)."""
    if not getattr(session.config.option, "loadgroup", False):  # set in an xdist worker
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {len(lost)} tests, e.g. {lost[0]}")


def _shared(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    docker = {"docker_runtime", "docker_procs", "docker_ready"} & set(getattr(item, "fixturenames", ()))
    if (
        docker
        or item.get_closest_marker("docker")
        or (callspec and callspec.params.get("runtime") == "docker")
    ):
        return "docker"  # one daemon; containers are found by node names that every test repeats
    if item.path.name in DEFAULT_CGROUP_PARENT:
        return "default-cgroup-parent"
    return None


@pytest.fixture(scope="session")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """tests/workers/test_ddp.py's job trained by one plain process, once a run (what every gang of
    it must train): what it printed, and its checkpoint directory. The first pytest-xdist worker to
    need it trains it; any other waits for that one and reads what it left (seconds of CPU each)."""
    need_torch()
    from tests.workers.test_ddp import JOB, finish_ok, start_gang

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-") else base
    root, printed = shared / "one-process", shared / "one-process" / "printed.txt"
    with open(shared / "one-process.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():
            root.mkdir(exist_ok=True)
            (single,) = start_gang(root, [], nodes=1, plain=True)
            finish_ok([single])
            printed.write_text(single.output)
    return printed.read_text(), root / JOB


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
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
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
def _own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A client cache of the test's own (a shipped directory's digest: ``fleet.client.cache``), for
    the Client in the test's process and the CLI processes it starts: never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture(autouse=True)
def _reachable_tmp_path(request: pytest.FixtureRequest) -> None:
    """Jobs run as their tenant's unprivileged uid (``job_uid_range``): let them reach the test's
    directory, as they would reach an operator's checkpoint root. pytest makes its temp dirs
    private (0700); a test whose jobs write into a directory makes it 0777."""
    if "tmp_path" not in request.fixturenames:
        return
    path = request.getfixturevalue("tmp_path")
    path.chmod(0o755)
    for parent in _made_by_pytest(path, request.getfixturevalue("tmp_path_factory").getbasetemp()):
        with contextlib.suppress(PermissionError):
            parent.chmod(0o711)


def _made_by_pytest(path: Path, base: Path) -> Iterator[Path]:
    """The directories above ``path`` that pytest made: up to its base temp dir (``--basetemp``,
    or ``pytest-N``), the xdist controller's one above a worker's ``popen-gwN``, and
    ``pytest-of-USER``; never a directory of the system's (``/tmp`` itself, a home)."""
    own = [base, *([base.parent] if base.name.startswith("popen-") else [])]
    for parent in path.parents:
        if not (parent in own or base in parent.parents or parent.name.startswith("pytest-")):
            return
        yield parent


@pytest.fixture
def procs(redis_url: str, runtime: str, tmp_path: Path, api: Api) -> Iterator[FleetProcs]:
    yield from _fleet(redis_url, runtime, tmp_path, api)


@pytest.fixture
def docker_procs(redis_url: str, docker_runtime: None, tmp_path: Path, api: Api) -> Iterator[FleetProcs]:
    """Services on the Docker runtime, for a module whose ``runtime`` is the process one."""
    yield from _fleet(redis_url, "docker", tmp_path, api)


def serve_api(redis_url: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """A ``fleet api`` on ``redis_url`` (``env``: settings of its own), and its URL once it listens."""
    port = free_port()
    env = {**os.environ, "FLEET_REDIS_URL": redis_url, **OPERATOR_ALLOWS, **env}
    argv = [sys.executable, "-m", "fleet", "api", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    return proc, listening(proc, port, "fleet api")


@pytest.fixture(scope="session")
def api_server(redis_server: str) -> Iterator[str]:
    """One ``fleet api`` for the session, on its Redis: stateless, so a flush between tests is
    all a test needs (and a token made after it: ``api``)."""
    proc, url = serve_api(redis_server)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def storage_api(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An API for a module whose fleets keep their checkpoints in one place
    (``FleetProcs.share_checkpoints``), and that place: the API that serves a job's kept outputs
    or a call's result reads the fleet's checkpoint storage, and one started per test costs a
    second of CPU. Over the session's Redis, as ``api_server``."""
    root = tmp_path_factory.mktemp("storage")
    root.chmod(0o755)  # the jobs, as their tenants' users, write their checkpoints under it
    proc, url = serve_api(redis_server, FLEET_CHECKPOINT_ROOT=str(root))
    yield url, root
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


@pytest.fixture
def client(api: Api) -> Iterator[Client]:
    c = api.client()
    yield c
    c.close()
