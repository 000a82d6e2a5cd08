"""A fleet of real child processes (controller, agents) with fast timings, for the tests and the
benchmarks that run real services (``tests/conftest.py`` builds its fixtures on it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fleet.agent.cgroups import detect
from fleet.agent.supervision import stop_supervisor
from fleet.agent.supervisor import kill_leftovers
from fleet.api.backend import Backend
from fleet.client import Client, JobHandle
from fleet.config import Settings, load_settings
from fleet.models import JobSpec

#: the tests' webhook receivers listen on 127.0.0.1, which an operator must allow (loopback is refused)
OPERATOR_ALLOWS = {
    "FLEET_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.1/32"]',
    # and the registries fleet ships with, plus the tests' own on 127.0.0.1 (any port)
    "FLEET_ALLOWED_REGISTRIES": '["localhost", "docker.io", "nvcr.io", "ghcr.io", "127.0.0.1"]',
}
TEST_IMAGE = "localhost/fleet/busybox:latest"
#: the services' default node lease, for a test whose node must outlast an interruption and keep its
#: jobs: the suite's 3 s (quick to see a lost node) is shorter than an agent's restart on a loaded
#: machine (3.3 s seen) or a Redis failover with the installed sentinels' 3 s down-after (~4 s)
LASTING_LEASE = {"FLEET_AGENT__NODE_LEASE_TTL_S": "10"}
#: coverage is measured in the services this harness starts (``make coverage``)
MEASURED = bool(os.environ.get("COVERAGE_PROCESS_CONFIG") or os.environ.get("COVERAGE_PROCESS_START"))


T = TypeVar("T")


class ApiEnv(Protocol):
    """The API the services' ``fleet`` commands talk to (tests/conftest.py's ``Api``)."""

    def env(self, token: str | None = None) -> dict[str, str]: ...


class FleetProcs:
    """Controllers and agents as real child processes, with fast test timings."""

    def __init__(self, redis_url: str, root: Path, runtime: str, api: ApiEnv | None = None) -> None:
        self.redis_url, self.root, self.runtime, self.api = redis_url, root, runtime, api
        self.checkpoints = root / "checkpoints"
        self.cgroup_parent = f"fleet-test/{hashlib.sha256(str(root).encode()).hexdigest()[:16]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.nodes: set[str] = set()
        self.env = dict(os.environ)
        self.env.update(
            FLEET_REDIS_URL=redis_url,
            FLEET_CHECKPOINT_ROOT=str(self.checkpoints),
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
            # the tenants' unprivileged uids cannot exec it, so a benchmark run from there runs its
            # jobs as root (the tests refuse such a checkout instead: tests/conftest.py)
            self.env.update(FLEET_AGENT__JOB_USER="0:0", FLEET_AGENT__ALLOW_ROOT_JOBS="true")

    def share_checkpoints(self, root: Path) -> None:
        """Keep the jobs' checkpoints and outputs in ``root`` (one an API already reads), not in the
        fleet's own directory: for services started after this."""
        self.checkpoints = root
        self.env["FLEET_CHECKPOINT_ROOT"] = str(root)

    def settings(self) -> Settings:
        return load_settings(redis_url=self.redis_url)

    def cli_env(self, **extra: str) -> dict[str, str]:
        """Environment for a ``fleet`` command: the API and an admin token, no Redis credentials."""
        assert self.api is not None, "this fleet runs on a Redis of its own, with no API"
        return {**self.api.env(), **extra}

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", *argv],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def controller(self, name: str = "controller") -> subprocess.Popen[bytes]:
        return self.start(name, ["controller"])

    def agent(self, node: str, gpus: int = 2, **env: str) -> subprocess.Popen[bytes]:
        self.nodes.add(node)
        return self.start(
            node,
            ["agent", "--node-name", node],
            FLEET_AGENT__SIMULATED_GPUS=str(gpus),
            FLEET_AGENT__STATE_DIR=str(self.root / node),
            **env,
        )

    def one_node(self, client: Client, node: str, gpus: int = 2, **env: str) -> None:
        """The smallest fleet: a controller and one agent, once ``client`` sees the node alive."""
        self.controller()
        self.agent(node, gpus, **env)
        self.wait_nodes(client, 1)

    def wait_nodes(self, client: Client, count: int, timeout: float = 20) -> None:
        try:
            until(lambda: sum(n.alive for n in client.nodes()) >= count, f"{count} nodes up", timeout)
        except AssertionError:
            raise AssertionError(f"{count} nodes did not come up:\n{self.logs()}") from None

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
        if MEASURED:  # under `make coverage`: a service saves what it ran only if it exits by itself
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.terminate()
            for proc in self.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=15)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for state in self.root.glob("*/"):  # supervisors outlive agents on purpose
            if MEASURED:  # asked to end (as `fleet uninstall agent` asks), it exits and saves its data
                stop_supervisor(state, wait_s=5)
            kill_supervisor(state)
        for meta in self.root.glob("*/attempts/*/meta.json"):  # process-runtime jobs run in own sessions
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(json.loads(meta.read_text())["pid"], signal.SIGKILL)
        remove_cgroups(self.cgroup_parent)


def job_root(prefix: str) -> Path:
    """A new temporary directory for a benchmark's fleet that its jobs can reach: they run as an
    unprivileged user and write their checkpoints under it (``mkdtemp`` makes it 0700)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    return root


def until(check: Callable[[], T | None], why: str = "condition", timeout: float = 30) -> T:
    """What ``check()`` returns once it is truthy; fail after ``timeout`` seconds naming ``why``.
    Asked 10 ms after the first try, then half as late again each time, at most every 0.1 s: a
    quick condition is seen at once, and a long wait does not keep the fleet's API busy answering."""
    deadline, pause = time.monotonic() + timeout, 0.01
    while not (found := check()):
        assert time.monotonic() < deadline, f"{why} not met within {timeout}s"
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)
    return found


def remove_cgroups(parent: str) -> None:
    """Kill what runs in the attempt cgroups under ``parent`` and remove them (a test's fleet)."""
    layout = detect()
    if layout.kind == "none":
        return
    tops = [m / parent for m in {*([layout.unified] if layout.unified else []), *layout.v1.values()}]
    nodes = [node for top in tops if top.is_dir() for node in top.iterdir() if node.is_dir()]
    kill_leftovers(nodes)
    for folder in sorted(
        (p for top in tops if top.is_dir() for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
    ):
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
    """Whether any user may execute ``path``."""
    return closed_above(path) is None


def closed_above(path: Path) -> Path | None:
    """The first of ``path``, the directories above it and above what it links to (a venv's
    ``python`` links to the system's) that other users cannot search; None when there is none."""
    real = path.resolve()
    for p in [*reversed(path.absolute().parents), *reversed(real.parents), real]:
        if not p.stat().st_mode & 0o001:
            return p
    return None


def kill_supervisor(state_dir: Path) -> None:
    """SIGKILL the node supervisor whose pid file is in ``state_dir`` (its jobs die with it)."""
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int((state_dir / "supervisor.pid").read_text()), signal.SIGKILL)


class DirectClient(Backend):
    """The backend on a Redis of the test's own (no API server there), handing out the Client's
    job handles: for tests of a fleet that runs on its own Redis (restarts, outages, chaos)."""

    def submit(self, spec: JobSpec | dict[str, Any], *, job_id: str | None = None) -> JobHandle:  # type: ignore[override]
        return JobHandle(self, super().submit(spec, job_id=job_id).id)  # type: ignore[arg-type]
