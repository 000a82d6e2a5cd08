"""A fleet over several hosts, set up as README "Running a fleet on your machines" says.

Four hosts on this machine, each a network namespace with its own address on a private switch
(tests/hosts.py): a control host running Redis with the users and passwords `fleet install redis`
wrote, the controller and the API (HTTPS, a certificate from a CA the test makes), each logging
in as its own Redis user; two agent hosts (process runtime, 2 simulated GPUs each, a shared
checkpoint root as NFS would be); and a laptop that only holds a token and the CA. Every host
runs fleet from the wheel of this tree, installed into a venv, and its services as the units
`fleet install` rendered say (tests/hosts.py `Unit`; no systemd runs them). Everything the test
does to the fleet goes through the CLI on the laptop, as a user or operator would.

Run alone: `make e2e-hosts` (root and iproute2 needed; skipped otherwise, failed under CI).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from tests.hosts import ROOT, Host, Network, Unit, build_wheel, can_make_hosts, install_wheel

pytestmark = [pytest.mark.integration, pytest.mark.hosts]
AGENTS = ("gpu-a", "gpu-b")
#: fast timings for the test, as an operator would put them in /etc/fleet/fleet.env
CONTROL_ENV = {
    "FLEET_RETRY_BACKOFF_S": "0.5",
    "FLEET_CONTROLLER__SCHEDULE_INTERVAL_S": "0.5",
    "FLEET_CONTROLLER__LEADER_LEASE_S": "2",
}
AGENT_ENV = {
    "FLEET_AGENT__HEARTBEAT_INTERVAL_S": "0.25",
    "FLEET_AGENT__NODE_LEASE_TTL_S": "3",
    "FLEET_AGENT__FENCE_MARGIN_S": "0.5",
    "FLEET_AGENT__RECONCILE_INTERVAL_S": "0.5",
    "FLEET_AGENT__STOP_GRACE_S": "2",
    "FLEET_AGENT__RUNTIME": "process",
    "FLEET_AGENT__GPUS": "simulated",
    "FLEET_AGENT__SIMULATED_GPUS": "2",
}
#: a listening port is open (run on a host: what it reaches is that host's network)
WAIT_PORT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"{sys.argv[1]}:{sys.argv[2]} not listening")
        time.sleep(0.1)
"""


@dataclass
class Fleet:
    net: Network
    control: Host
    agents: dict[str, Host]
    laptop: Host
    bin: Path
    base: Path
    checkpoints: Path
    api_url: str

    def cli(self, *args: str, check: bool = True, timeout: float = 120, **env: str) -> str:
        """``fleet ARGS`` on the laptop: its credentials file (URL, token, CA) and nothing else."""
        environ = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "FLEET_CREDENTIALS": str(self.base / "laptop" / "credentials.json"),
            **env,
        }
        done = self.laptop.run(["fleet", *args], env=environ, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(
                f"fleet {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}\n{self.logs()}"
            )
        return done.stdout

    def show(self, job: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.cli("show", job, "-o", "json"))
        return found

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["name"]: n for n in json.loads(self.cli("nodes", "-o", "json"))}

    def submit(self, *args: str) -> str:
        return self.cli("submit", *args).strip()

    def until(self, what: Callable[[], bool], what_for: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what_for}: not within {timeout}s\n{self.logs()}")
            time.sleep(0.3)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.relative_to(self.base)}\n{p.read_text()[-3000:]}"
            for p in sorted(self.base.glob("*/state/*.log"))
        )


def _tree(path: Path) -> Path:
    """Make ``path`` and let every user through it (jobs run as nobody, as on a real host)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    return path


def _write_env(root: Path, values: dict[str, str]) -> None:
    env = root / "etc" / "fleet" / "fleet.env"
    env.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    env.chmod(0o600)


def _edit(path: Path, *pairs: tuple[str, str]) -> None:
    """Replace lines of the installed fleet.toml, as an operator edits it (each must be there)."""
    text = path.read_text()
    for old, new in pairs:
        assert old in text, f"{path.name} has no line {old!r}"
        text = text.replace(old, new, 1)
    path.write_text(text)


def _ca(folder: Path, address: str) -> tuple[Path, Path, Path]:
    """(CA certificate, the API's certificate for ``address`` signed by it, its key)."""
    ca, ca_key, cert, key, csr = (folder / n for n in ("ca.pem", "ca.key", "api.pem", "api.key", "api.csr"))
    ext = folder / "api.ext"
    ext.write_text(f"subjectAltName=IP:{address}\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for argv in (
        ["req", "-x509", *ec, "-days", "2", "-subj", "/CN=fleet test CA", "-keyout", ca_key, "-out", ca],
        ["req", *ec, "-subj", f"/CN={address}", "-keyout", key, "-out", csr],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            cert,
        ],
    ):
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    why = can_make_hosts()
    need(why is None, f"several hosts: {why}")
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    need(shutil.which("openssl") is not None, "openssl not installed")
    base = _tree(tmp_path_factory.mktemp("hosts"))
    for parent in list(base.parents)[:2]:
        parent.chmod(0o711)
    bin_ = install_wheel(build_wheel(base / "wheel"), base / "venv")
    checkpoints = _tree(base / "shared" / "checkpoints")  # the NFS every agent host mounts
    net = Network()
    try:
        control = net.add("control")
        agents = {name: net.add(name) for name in AGENTS}
        laptop = net.add("laptop")
        yield _set_up(net, control, agents, laptop, bin_, base, checkpoints)
    finally:
        net.close()


def _set_up(
    net: Network,
    control: Host,
    agents: dict[str, Host],
    laptop: Host,
    bin_: Path,
    base: Path,
    checkpoints: Path,
) -> Fleet:
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    python = str(bin_ / "python")
    # fleet on every host is the wheel's, not this checkout's
    where = control.run([python, "-c", "import fleet; print(fleet.__file__)"], env=env).stdout
    assert where.startswith(str(base / "venv")), where

    # The control host: Redis with the users and passwords `fleet install redis` writes
    root = _tree(base / "control" / "root")
    state = _tree(base / "control" / "state")
    control.run(["fleet", "install", "redis", "--root", str(root)], env=env)
    etc = root / "etc" / "fleet"
    passwords = etc / "redis-passwords"
    data = _tree(root / "var" / "lib" / "fleet" / "redis")
    # its config as installed, but listening on the host's address and with its paths under the
    # root (Redis applies `dir` as it reads it, so a command-line override comes too late)
    conf = state / "redis.conf"
    shutil.copyfile(etc / "redis.conf", conf)
    _edit(
        conf,
        ("bind 127.0.0.1 -::1", f"bind {control.address}"),
        ("dir /var/lib/fleet/redis", f"dir {data}"),
        ("aclfile /etc/fleet/users.acl", f"aclfile {etc / 'users.acl'}"),
    )
    control.start(["redis-server", str(conf)], env, state / "redis.log")
    control.run([python, "-c", WAIT_PORT, control.address, "6379", "30"], env=env)
    redis_url = f"redis://{control.address}:6379/0"
    # the controller and the API, each with its own Redis user's password
    for service in ("controller", "api"):
        secret = passwords / f"fleet-{service}.password"
        control.run(
            [
                "fleet",
                "install",
                service,
                "--root",
                str(root),
                "--redis-url",
                redis_url,
                "--redis-password-file",
                str(secret),
            ],
            env=env,
        )
    ca, cert, key = _ca(_tree(etc / "tls"), control.address)
    _edit(
        etc / "fleet.toml",
        ('host = "127.0.0.1"', f'host = "{control.address}"'),
        ('# tls_cert = "/etc/fleet/tls/api.pem"', f'tls_cert = "{cert}"'),
        ('# tls_key = "/etc/fleet/tls/api.key"', f'tls_key = "{key}"'),
    )
    _write_env(root, {**CONTROL_ENV, "FLEET_CHECKPOINT_ROOT": str(checkpoints)})
    Unit(root, "controller").start(control, state)
    Unit(root, "api").start(control, state)
    api_url = f"https://{control.address}:8080"
    laptop.run([python, "-c", WAIT_PORT, control.address, "8080", "60"], env=env)
    # the first admin's token, made on the control host with Redis credentials (fleet-admin's)
    admin = {
        **env,
        "FLEET_REDIS_USERNAME": "fleet-admin",
        "FLEET_REDIS_PASSWORD_FILE": str(passwords / "fleet-admin.password"),
    }
    made = control.run(
        [
            "fleet",
            "--config",
            str(etc / "fleet.toml"),
            "token",
            "create",
            "--user",
            "root",
            "--tenant",
            "default",
            "--role",
            "admin",
            "--direct",
        ],
        env=admin,
    )
    token = made.stdout.strip().splitlines()[-1]

    # The agent hosts: the agent's password copied over, then `fleet install agent`
    for name, host in agents.items():
        root = _tree(base / name / "root")
        state = _tree(base / name / "state")
        copied = base / name / "fleet-agent.password"
        shutil.copyfile(passwords / "fleet-agent.password", copied)
        host.run(
            [
                "fleet",
                "install",
                "agent",
                "--root",
                str(root),
                "--redis-url",
                redis_url,
                "--redis-password-file",
                str(copied),
            ],
            env=env,
        )
        copied.unlink()
        _edit(
            root / "etc" / "fleet" / "fleet.toml",
            ('# node_name = "gpu-01"', f'node_name = "{name}"'),
            ('address = ""', f'address = "{host.address}"'),
        )
        agent_state = _tree(_tree(_tree(root / "var") / "lib") / "fleet") / "agent"
        _write_env(
            root,
            {
                **AGENT_ENV,
                "FLEET_CHECKPOINT_ROOT": str(checkpoints),
                "FLEET_AGENT__STATE_DIR": str(agent_state),
            },
        )
        Unit(root, "agent").start(host, state)

    # The laptop: a token and the CA, no Redis credentials
    _tree(base / "laptop")
    shutil.copyfile(ca, base / "laptop" / "ca.pem")
    fleet = Fleet(net, control, agents, laptop, bin_, base, checkpoints, api_url)
    fleet.cli("login", api_url, "--ca-file", str(base / "laptop" / "ca.pem"), FLEET_TOKEN=token)
    fleet.until(lambda: sum(n["alive"] for n in fleet.nodes().values()) == 2, "both agent hosts up")
    return fleet


def test_jobs_run_on_both_agent_hosts(fleet: Fleet) -> None:
    # Given two agent hosts of 2 GPUs each, when two 2-GPU jobs that print their host's address run
    script = "ip -o -4 addr show dev eth0; sleep 300"
    jobs = [fleet.submit("--name", f"where-{i}", "--gpus", "2", "--", "sh", "-c", script) for i in range(2)]
    fleet.until(lambda: all(fleet.show(j)["state"] == "RUNNING" for j in jobs), "both jobs running")
    # Then one runs on each host, and each job's output says it runs at its host's address
    nodes = {job: fleet.show(job)["node"] for job in jobs}
    assert sorted(nodes.values()) == list(AGENTS)
    for job, node in nodes.items():
        address = f"inet {fleet.agents[node].address}/24"
        fleet.until(lambda: address in fleet.cli("logs", job), f"{job} printing {address}")  # noqa: B023
        fleet.cli("cancel", job)


#: a member of a 2-node job: rank 0 listens at MASTER_ADDR:MASTER_PORT, rank 1 connects and says hello
GANG = """
import os, socket, time
rank, addr = int(os.environ["FLEET_NODE_RANK"]), os.environ["MASTER_ADDR"]
port = int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    conn, peer = server.accept()
    print(f"rank 0 at {addr}:{port} heard {conn.recv(100).decode()!r} from {peer[0]}")
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(b"hello from rank 1")
    print(f"rank 1 reached {addr}:{port}")
"""


def test_a_gang_spans_both_hosts_and_its_members_reach_each_other(fleet: Fleet) -> None:
    # When a 2-node job of one GPU per member runs, its members talking over the network
    job = fleet.submit("--name", "gang", "--nodes", "2", "--gpus", "2", "--", "/usr/bin/python3", "-c", GANG)
    fleet.cli("wait", job, "--timeout", "90")
    # Then it succeeded with a member on each host
    status = fleet.show(job)
    assert status["state"] == "SUCCEEDED" and status["attempt"] == 1
    first, second = (fleet.agents[m["node"]] for m in status["members"])
    assert {first.name, second.name} == set(AGENTS)
    # And rank 1 reached rank 0 at its host's address, from its own (not over loopback)
    master = f"{first.address}:{status['master_port']}"
    assert fleet.cli("logs", job, "--rank", "0").strip() == (
        f"rank 0 at {master} heard 'hello from rank 1' from {second.address}"
    )
    assert fleet.cli("logs", job, "--rank", "1").strip() == f"rank 1 reached {master}"


#: sleeps in attempt 1 (until stopped); ends at once in later ones, saying which attempt
FIRST_ATTEMPT_HANGS = 'if [ "$FLEET_ATTEMPT" = 1 ]; then sleep 300; fi; echo "attempt $FLEET_ATTEMPT"'


def test_the_maintenance_script_drains_a_host_with_a_deadline(fleet: Fleet) -> None:
    # Given a job running on one host
    job = fleet.submit("--name", "long", "--gpus", "1", "--", "sh", "-c", FIRST_ATTEMPT_HANGS)
    fleet.until(lambda: fleet.show(job)["state"] == "RUNNING", "the job running")
    node = fleet.show(job)["node"]
    (other,) = set(AGENTS) - {node}
    # When an operator runs the documented maintenance script on it from the laptop (a 1 s deadline),
    # the maintenance itself recording what the fleet says of the host meanwhile
    script = ROOT / "config" / "examples" / "maintain-node.sh"
    seen = fleet.base / "laptop" / "during-maintenance.json"
    maintenance = ["sh", "-c", f"fleet nodes show {node} -o json > {seen}"]
    done = fleet.laptop.run(
        ["bash", str(script), node, *maintenance],
        check=False,
        env=_laptop_env(fleet, DEADLINE="1s", GRACE="2s", TIMEOUT="60s"),
    )
    # Then it drained the host, ran the maintenance on a DRAINED host holding no job, and put it back
    assert done.returncode == 0, done.stdout + done.stderr + fleet.logs()
    during = json.loads(seen.read_text())
    assert (during["state"], during["jobs"]) == ("DRAINED", [])
    assert "State:     READY" in done.stdout
    # And the job moved to the other host (not its failure: no retry spent) and ran to its end there
    fleet.cli("wait", job, "--timeout", "60")
    status = fleet.show(job)
    assert (status["state"], status["node"], status["attempt"]) == ("SUCCEEDED", other, 2)
    assert (status["failures"], status["infra_requeues"]) == (0, 1)
    assert any(f"node {node} drained" in e["reason"] for e in status["history"]), status["history"]
    assert fleet.cli("logs", job).strip() == "attempt 2"


def _laptop_env(fleet: Fleet, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{fleet.bin}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "FLEET_CREDENTIALS": str(fleet.base / "laptop" / "credentials.json"),
        **extra,
    }


#: writes the machine's uptime (one clock for every host here) to its checkpoint directory: 20 times,
#: and in attempt 1 until stopped
TICKER = (
    'n=20; if [ "$FLEET_ATTEMPT" = 1 ]; then n=1000000; fi; '
    'for i in $(seq $n); do cut -d" " -f1 /proc/uptime >> "$FLEET_CHECKPOINT_DIR/ticks-$FLEET_ATTEMPT"; '
    "sleep 0.05; done"
)


def _ticks(fleet: Fleet, job: str, attempt: int) -> list[float]:
    path = fleet.checkpoints / job / f"ticks-{attempt}"
    return [float(t) for t in path.read_text().split()] if path.exists() else []


def test_cutting_a_hosts_link_moves_its_jobs_and_fences_the_old_attempt(fleet: Fleet) -> None:
    # Given a job running on one host, writing its ticks to the shared checkpoint storage
    job = fleet.submit("--name", "tick", "--gpus", "1", "--", "sh", "-c", TICKER)
    fleet.until(lambda: len(_ticks(fleet, job, 1)) > 5, "attempt 1 ticking")
    node = fleet.show(job)["node"]
    (other,) = set(AGENTS) - {node}
    host = fleet.agents[node]
    # When the host's network link is cut
    fleet.net.cut(host)
    try:
        # Then its lease expires, the job is requeued (no retry spent) and runs to its end on the other host
        fleet.cli("wait", job, "--timeout", "90")
        status = fleet.show(job)
        assert (status["state"], status["node"], status["attempt"]) == ("SUCCEEDED", other, 2)
        assert (status["failures"], status["infra_requeues"]) == (0, 1)
        assert any(f"node {node} down" in e["reason"] for e in status["history"]), status["history"]
        assert fleet.nodes()[node]["alive"] is False
    finally:
        fleet.net.restore(host)
    # And once the link is back, the host rejoins: its agent outlived the outage
    fleet.until(lambda: fleet.nodes()[node]["alive"], f"{node} back", timeout=60)
    # And the old attempt did not run beside the new one: the host's supervisor stopped it before
    # its lease could expire, cut off as it was, so attempt 1's last tick came before attempt 2's first
    first, second = _ticks(fleet, job, 1), _ticks(fleet, job, 2)
    assert len(second) == 20 and first
    assert max(first) < min(second), (max(first), min(second))
    supervisor = fleet.base / node / "root" / "var" / "lib" / "fleet" / "agent" / "supervisor.log"
    assert "fenced attempts=1" in supervisor.read_text()
