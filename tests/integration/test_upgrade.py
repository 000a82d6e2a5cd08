"""Upgrades in place from the previous release, 0.1.0 (``tests/fixtures/release-0.1.0``).

- From its records: a Redis snapshot 0.1.0 wrote (``make_release_dump.py`` says what it holds)
  is loaded into a fresh ``redis-server`` and this release's services start on it. Every record
  reads; the jobs whose nodes are gone are requeued and run, the queued ones run.
- Live, one service at a time: the 0.1.0 wheel's own API, controller and agents (its install dir
  first on their path; the checkout never is) run long jobs; the controller and API are replaced,
  then each agent (SIGTERM to the agent alone, as systemd's restart with ``KillMode=process``).
  The jobs keep their attempt and process throughout and end SUCCEEDED; while the fleet is mixed,
  ``fleet nodes`` says so.

Real Redis, real processes, the process runtime, simulated GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet import Client, JobState, __version__
from fleet.agent.supervision import SupervisorClient
from fleet.agent.supervisor import PROTOCOL, SOCKET
from fleet.errors import Unauthorized
from fleet.ops.local import free_port
from fleet.versions import HEADER, OLDEST
from tests.conftest import FleetProcs, need
from tests.fixtures.make_release_dump import (
    DUMP,
    MANIFEST,
    WHEEL,
    fleet_argv,
    install,
    listening,
    release_path,
)
from tests.fixtures.make_release_dump import wait_for as eventually

pytestmark = pytest.mark.integration
YEARS = str(10 * 365 * 86_400)
#: settings the test harness gives every service that came after 0.1.0
NEWER_SETTINGS = (
    "FLEET_AGENT__CGROUP_PARENT",
    "FLEET_AGENT__DEFAULT_MEMORY",
    "FLEET_AGENT__JOB_NETWORK_GUARD",
)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 0.1.0 wheel, installed into a directory of its own."""
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    return install(WHEEL, tmp_path_factory.mktemp("release-0.1.0") / "site")


class Fleet(FleetProcs):
    """Services of this release or, with ``old=True``, of 0.1.0: run as ``python -P -m`` from the
    test's directory, so only ``PYTHONPATH`` decides which ``fleet`` they import."""

    def __init__(self, redis_url: str, root: Path, release: Path) -> None:
        super().__init__(redis_url, root, "process")
        self.release = release

    def start(self, name: str, argv: list[str], old: bool = False, **env: str) -> subprocess.Popen[bytes]:
        full = self.old_env(env) if old else {**self.env, **env}
        with open(self.root / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                fleet_argv(*argv), env=full, cwd=self.root, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        return proc

    def old_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment of a 0.1.0 service or command: without the settings 0.1.0 refuses as
        unknown (an operator's old config would not hold them), its install dir first on the path."""
        full = {k: v for k, v in {**self.env, **env}.items() if k not in NEWER_SETTINGS}
        return {**full, "PYTHONPATH": release_path(self.release)}

    def api_server(self, name: str, port: int, old: bool = False) -> None:
        self.start(name, ["api", "--port", str(port), "--log-level", "warning"], old=old)
        eventually(lambda: listening(port), f"{name} listening")

    def node(self, node: str, name: str, old: bool = False) -> None:
        """An agent for ``node`` with 2 GPUs; its state dir is the node's, whichever release runs it."""
        self.nodes.add(node)
        self.start(
            name,
            ["agent", "--node-name", node],
            old=old,
            FLEET_AGENT__SIMULATED_GPUS="2",
            FLEET_AGENT__STATE_DIR=str(self.root / node),
        )

    def terminate(self, name: str) -> None:
        """SIGTERM to this process alone (systemd's stop of an agent unit with KillMode=process)."""
        self.procs[name].send_signal(signal.SIGTERM)
        self.procs[name].wait(timeout=30)  # uvicorn ends by SIGTERM again: no exit code to check


def redis_server(root: Path, dump: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of the test's own; with ``dump``, started from that snapshot."""
    port, data = free_port(), root / "redis"
    data.mkdir()
    if dump is not None:
        shutil.copyfile(dump, data / "dump.rdb")
    argv = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data),
        "--dbfilename",
        "dump.rdb",
        "--appendonly",
        "no",
        "--save",
        "",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    eventually(lambda: redis.Redis.from_url(url).ping(), "redis up", timeout=30)
    return proc, url


def _fleet(root: Path, release: Path, dump: Path | None) -> Iterator[Fleet]:
    server, url = redis_server(root, dump)
    procs = Fleet(url, root, release)
    yield procs
    procs.stop()
    server.kill()
    server.wait()


@pytest.fixture
def fleet(tmp_path: Path, release: Path) -> Iterator[Fleet]:
    """An empty Redis, for services of either release."""
    yield from _fleet(tmp_path, release, None)


@pytest.fixture
def dumped(tmp_path: Path, release: Path) -> Iterator[Fleet]:
    """A Redis started from the snapshot 0.1.0 wrote, its services gone."""
    yield from _fleet(tmp_path, release, DUMP)


@pytest.fixture
def clients() -> Iterator[Callable[[str, str], Client]]:
    """Clients (URL, token) closed when the test ends, however it ends."""
    made: list[Client] = []

    def client(url: str, token: str) -> Client:
        made.append(Client(url, token))
        return made[-1]

    yield client
    for client in made:
        client.close()


def fleet_cli(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """This release's ``fleet`` command, as a user runs it: the API and a token, no Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_REDIS")}
    env.update(FLEET_API_URL=url, FLEET_TOKEN=token)
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args], env=env, capture_output=True, text=True, timeout=60
    )


# -- from 0.1.0's records ----------------------------------------------------------------------


def test_a_fleet_upgraded_from_0_1_0_reads_its_records_and_runs_its_jobs(
    dumped: Fleet, clients: Callable[[str, str], Client]
) -> None:
    fleet = dumped
    manifest: dict[str, Any] = json.loads(MANIFEST.read_text())
    jobs, role, tokens = manifest["jobs"], manifest["roles"], manifest["tokens"]
    fleet.env.update(
        FLEET_JOB_RETENTION_S=YEARS, FLEET_TOMBSTONE_RETENTION_S=YEARS, FLEET_NODE_RETENTION_S=YEARS
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Given this release's API on the Redis 0.1.0 left (its services gone)
    fleet.api_server("api", port)
    client = clients(url, tokens["admin"])
    # Then the tokens 0.1.0 issued authenticate as they did, and the one it revoked does not
    assert client.whoami().user == "ops"
    alice = clients(url, tokens["research_user"])
    assert (alice.whoami().user, alice.whoami().tenant) == ("alice", "research")
    with pytest.raises(Unauthorized):
        clients(url, tokens["revoked"]).whoami()
    # And every job lists, in the state 0.1.0 left it, with its tenant
    listed = {j.id: j for j in client.jobs()}
    assert {i: (j.state.value, j.spec.tenant) for i, j in listed.items()} == {
        i: (j["state"], j["tenant"]) for i, j in jobs.items()
    }
    assert {j.id for j in alice.jobs()} == {i for i, j in jobs.items() if j["tenant"] == "research"}
    assert {(t.tenant.name, t.tenant.weight, t.tenant.max_gpus) for t in client.tenants()} >= {
        ("research", 2.0, 4)
    }
    assert [line.line for line in client.logs(role["done"])] == manifest["logs"][role["done"]]
    # And `fleet show` reads the gang, the elastic job and both arrays; its old nodes show as down,
    # of a release that recorded none
    gang = fleet_cli(url, tokens["admin"], "show", role["gang"])
    assert gang.returncode == 0 and "old-a" in gang.stdout and "old-b" in gang.stdout, gang
    elastic = fleet_cli(url, tokens["admin"], "show", role["elastic"], "-o", "json")
    assert elastic.returncode == 0, elastic
    assert json.loads(elastic.stdout)["spec"]["gpus"] == {"min": 1, "max": 2}
    assert json.loads(elastic.stdout)["spec"]["profile"] == "cifar10"
    for array, size in manifest["arrays"].items():
        shown = fleet_cli(url, tokens["admin"], "show", array, "-o", "json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["size"] == size, shown
    nodes = fleet_cli(url, tokens["admin"], "nodes")
    assert nodes.returncode == 0, nodes
    assert [line.split()[:2] for line in nodes.stdout.splitlines()[1:3]] == [
        ["old-a", "DOWN"],
        ["old-b", "DOWN"],
    ]
    assert nodes.stdout.count(OLDEST) == 2 and "mixed" not in nodes.stdout
    assert {n.name: n.version for n in client.nodes()} == {"old-a": "", "old-b": ""}

    # When this release's controller and two agents start
    fleet.controller()
    fleet.node("new-a", "new-a")
    fleet.node("new-b", "new-b")
    # Then every job 0.1.0 left queued or running ends SUCCEEDED: the running ones (their nodes are
    # gone) after a requeue, the queued ones at their first attempt; the ended ones stay as they were
    for job_id, before in jobs.items():
        status = client.wait(job_id, timeout=120)
        if before["state"] in ("QUEUED", "RUNNING"):
            assert status.state == JobState.SUCCEEDED, (job_id, status, fleet.logs())
        else:
            assert (status.state.value, status.attempt) == (before["state"], before["attempt"])
        if before["state"] == "RUNNING":
            assert status.attempt == before["attempt"] + 1 and status.infra_requeues == 1, status
            assert status.node in ("new-a", "new-b")
            assert client.logs(job_id)[-1].line == ("0" if job_id == "sweep-0" else "done")
        if before["state"] == "QUEUED":
            assert status.attempt == 1
    assert client.array("sweep").tasks[JobState.SUCCEEDED] == 4
    assert client.get(role["gang"]).nodes_held and set(client.get(role["gang"]).nodes_held) == {
        "new-a",
        "new-b",
    }
    # And now every service runs this release
    eventually(lambda: client.versions().controller == __version__, "the controller's version")
    versions = client.versions()
    assert (versions.api, versions.nodes, versions.mixed) == (
        __version__,
        {"new-a": __version__, "new-b": __version__},
        "",
    )


# -- live, one service at a time ---------------------------------------------------------------


def old_cli(fleet: Fleet, *args: str, **env: str) -> str:
    """0.1.0's ``fleet`` command (from its install dir alone); its standard output."""
    done = subprocess.run(
        fleet_argv(*args), env=fleet.old_env(env), cwd=fleet.root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done
    return done.stdout


def status_page(url: str, token: str) -> str:
    request = urllib.request.Request(f"{url}/ui", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as page:
        return str(page.read().decode())


def attempts(fleet: Fleet, node: str) -> dict[str, int]:
    """The attempts a node's supervisor started: ``<job>.<attempt>`` -> the pid of its process."""
    metas = (fleet.root / node / "attempts").glob("*/meta.json")
    return {meta.parent.name: json.loads(meta.read_text())["pid"] for meta in metas}


def test_a_rolling_upgrade_keeps_every_job_on_its_agent_and_says_the_fleet_is_mixed(
    fleet: Fleet, clients: Callable[[str, str], Client]
) -> None:
    # the lease outlives an agent's restart by far (the supervisor fences its jobs when it lapses)
    fleet.env.update(FLEET_AGENT__NODE_LEASE_TTL_S="10")
    go = fleet.root / "go"
    wait = ["sh", "-c", f'echo up; while [ ! -e "{go}" ]; do sleep 0.1; done; echo done']
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Given a fleet of 0.1.0: API, controller, two agents of 2 GPUs, and a gang and two 1-GPU jobs
    # on them, submitted with its own CLI
    fleet.api_server("api-old", port, old=True)
    fleet.start("controller-old", ["controller"], old=True)
    fleet.node("t-a", "t-a-old", old=True)
    fleet.node("t-b", "t-b-old", old=True)
    token = old_cli(
        fleet, "token", "create", "--user", "ops", "--tenant", "default", "--role", "admin", "--direct"
    ).split()[0]
    user = {"FLEET_API_URL": url, "FLEET_TOKEN": token}
    jobs = [
        old_cli(fleet, "submit", "--gpus", "1", "--", *wait, **user).strip(),
        old_cli(fleet, "submit", "--nodes", "2", "--gpus-per-node", "1", "--", *wait, **user).strip(),
        old_cli(fleet, "submit", "--gpus", "1", "--", *wait, **user).strip(),
    ]
    client = clients(url, token)
    eventually(lambda: all(client.get(j).state == JobState.RUNNING for j in jobs), "three jobs running")
    assert client.server_version == ""  # the API is 0.1.0's: it names no release
    held = {node: attempts(fleet, node) for node in ("t-a", "t-b")}
    assert all(held.values()) and sum(len(a) for a in held.values()) == 4  # the gang's 2 members, 2 jobs

    # When the controller and then the API are replaced by this release's
    fleet.terminate("controller-old")
    fleet.controller("controller-new")
    fleet.terminate("api-old")
    fleet.api_server("api-new", port)
    eventually(lambda: client.versions().controller == __version__, "the new controller leading")
    # Then the fleet says it is mixed, naming what runs which release
    assert client.server_version == __version__
    assert (
        client.versions().mixed
        == f"mixed versions: {__version__} (the API, the controller); {OLDEST} (t-a, t-b)"
    )

    # When each agent in turn is stopped (SIGTERM to it alone) and this release's started on its state
    for node in ("t-a", "t-b"):
        fleet.terminate(f"{node}-old")
        fleet.node(node, f"{node}-new")
        eventually(lambda node=node: client.versions().nodes[node] == __version__, f"{node} upgraded")
        # Then its jobs were reattached: the same attempts, the same processes, still running
        log = fleet.root / f"{node}-new.log"
        eventually(lambda log=log: "attempt_reattached" in log.read_text(), f"{node}'s reconcile pass")
        assert attempts(fleet, node) == held[node]
        assert all(client.get(j).state == JobState.RUNNING and client.get(j).attempt == 1 for j in jobs)
        for pid in held[node].values():
            os.kill(pid, 0)  # alive
        # And `fleet nodes` shows each node's release, and says the fleet is mixed until the last one
        shown = fleet_cli(url, token, "nodes")
        rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:3]}
        assert __version__ in rows[node], shown.stdout
        assert (OLDEST in rows["t-b"]) == ("mixed versions:" in shown.stdout) == (node == "t-a"), shown.stdout
        # And so does the status page
        page = status_page(url, token)
        assert ("mixed versions:" in page) == (node == "t-a") and f"fleet {__version__}" in page

    # When the jobs are let finish
    go.touch()
    # Then each ended SUCCEEDED at its first attempt, never requeued
    for job_id in jobs:
        status = client.wait(job_id, timeout=60)
        assert (status.state, status.attempt, status.infra_requeues) == (JobState.SUCCEEDED, 1, 0), (
            fleet.logs()
        )
        states = [e.state for e in client.history(job_id)]  # a gang starts each member: STARTING twice
        assert list(dict.fromkeys(states)) == ["QUEUED", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"]
        assert states.count("QUEUED") == states.count("RUNNING") == 1, states
        assert [line.line for line in client.logs(job_id)] == ["up", "done"]
    # And `fleet version` reports one release everywhere
    version = fleet_cli(url, token, "version")
    assert version.returncode == 0 and "mixed" not in version.stdout, version
    assert [line.split() for line in version.stdout.splitlines()[:3]] == [
        ["client:", __version__],
        ["api:", __version__],
        ["controller:", __version__],
    ]
    assert version.stdout.splitlines()[3].split() == ["nodes:", __version__, "on", "2"]


def test_fleet_version_names_the_api_release_to_a_caller_without_a_valid_token(fleet: Fleet) -> None:
    port = free_port()
    fleet.api_server("api", port)
    # When `fleet version` runs with a token the API does not know
    shown = fleet_cli(f"http://127.0.0.1:{port}", "fleet_000000000000_nope", "version")
    # Then it names the client's release and the API's (from its header), and why no more: exit 8
    assert shown.returncode == 8, shown
    assert [line.split() for line in shown.stdout.splitlines()] == [
        ["client:", __version__],
        ["api:", __version__],
    ]
    assert "token" in shown.stderr
    # And the header it read is on every answer, an error's too
    with Client(f"http://127.0.0.1:{port}", "fleet_000000000000_nope") as client, pytest.raises(Unauthorized):
        client.whoami()
    assert client.server_version == __version__ and HEADER == "Fleet-Version"


def test_an_upgraded_agent_replaces_an_idle_supervisor_of_0_1_0_and_keeps_a_busy_one(
    release: Path, tmp_path: Path
) -> None:
    """0.1.0's supervisor starts attempts outside any cgroup: the agent replaces it once it holds
    nothing, and keeps it while it fences running attempts (they must not die for an upgrade)."""
    supervisor = release / "fleet" / "agent" / "supervisor.py"

    def old_supervisor(state: Path) -> subprocess.Popen[bytes]:
        state.mkdir()
        with open(state / "supervisor.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(supervisor), str(state), "--margin", "1"],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        eventually(lambda: (state / SOCKET).exists(), "0.1.0's supervisor listening")
        return proc

    # Given 0.1.0's supervisor holding nothing on one node, and one holding a running attempt on another
    idle, busy = old_supervisor(tmp_path / "idle"), old_supervisor(tmp_path / "busy")
    spawn = {"op": "spawn", "key": "job-1.1", "argv": ["sleep", "300"], "env": {}, "cwd": str(tmp_path)}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, sock.makefile("rb") as answers:
        sock.connect(str(tmp_path / "busy" / SOCKET))  # as 0.1.0's agent spoke to it
        for request in ({"op": "lease", "until": time.monotonic() + 600}, spawn):
            sock.sendall(json.dumps(request).encode() + b"\n")
            assert "error" not in json.loads(answers.readline())
    fresh = SupervisorClient(tmp_path / "idle", margin_s=1)
    kept = SupervisorClient(tmp_path / "busy", margin_s=1)
    try:
        # When this release's agent reaches each node's supervisor
        fresh.ensure()
        kept.ensure()
        # Then the idle one has made way for this release's, which puts attempts in their cgroups
        assert idle.wait(timeout=15) == 0
        answer = fresh.request("ping")
        assert answer["protocol"] == PROTOCOL and answer["pid"] != idle.pid
        # And the busy one still runs and holds its attempt
        answer = kept.request("ping")
        assert "protocol" not in answer and (answer["pid"], answer["held"]) == (busy.pid, ["job-1.1"])
    finally:
        for client in (fresh, kept):
            client.shutdown()
        for proc in (idle, busy):
            proc.kill()
            proc.wait()
