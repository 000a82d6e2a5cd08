"""Docker jobs against the node's network: real agents, the real Docker daemon, real iptables.

Around the node the test sets up what a job could go for: a service of the node's own bound to
127.0.0.1 (a Redis, the agent's metrics), one on the node's other addresses, including a link-local
one, and a machine outside (a network namespace on a veth) answering on an ordinary address and on
a link-local one, as a cloud's metadata service does at 169.254.169.254. The real metadata address
is left alone: the machine running the tests may need it. Each case runs with the network guard
(the default) and without it (the operator's opt-out), which shows what the guard stops.

Needs root, iproute2, iptables and Docker; fleet's network and rules must not be in use on the
host already (the test removes them when it ends).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fleet import Client, JobSpec, JobState
from fleet.agent import netguard
from fleet.config_sections import AgentSettings
from fleet.ops.doctor.host import network_guard_check
from fleet.ops.local import free_port
from tests.conftest import Api, FleetProcs, need
from tests.support import wait_for

#: the network guard's rules reject every job uid's traffic to loopback host-wide, and its network
#: and chains are the host's: nothing may run beside this module
pytestmark = [pytest.mark.integration, pytest.mark.alone]
#: a uid of the default job_uid_range, kept for this test: no other process of the host runs as it
JOB_USER = "1000999999:1000999999"
NODE_ADDRESS, OUTSIDE = "198.51.100.1", "198.51.100.2"  # a veth pair, the node's end and the outside's
NODE_LINK_LOCAL, OUTSIDE_LINK_LOCAL = "169.254.77.1", "169.254.77.2"
OUTSIDE_PORT = 8000
#: listens on each address given (host:port ...) and greets whoever connects; says "ready" once listening
SERVE = """
import socket, sys, threading
def serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"hello\\n"); c.close()
socks = []
for where in sys.argv[1:]:
    host, port = where.rsplit(":", 1)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port))); s.listen(16); socks.append(s)
for s in socks[1:]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
serve(socks[0])
"""
#: a job's probe: one line per host:port it is given, "<host:port> hello" or "<host:port> unreached"
PROBE = (
    'probe() { for t in "$@"; do out=$(nc -w 3 "${t%:*}" "${t#*:}" </dev/null 2>/dev/null); '
    'echo "$t ${out:-unreached}"; done; }; '
)


@dataclass(frozen=True)
class Around:
    """What is around the node: host:port of each listener."""

    node_local: str  # 127.0.0.1
    node: str  # the node's own address
    node_link_local: str
    outside: str
    outside_link_local: str


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _fleet_in_use() -> bool:
    chains = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=30).stdout
    networks = subprocess.run(
        ["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    return netguard.CHAIN_INPUT in chains or netguard.NETWORK in networks


def _serve(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "a listener did not start"
    return proc


@pytest.fixture(scope="module")
def around(docker_ready: bool) -> Iterator[Around]:
    need(os.geteuid() == 0, "iptables and network namespaces need root")
    need(
        shutil.which("ip") is not None and shutil.which("iptables") is not None,
        "iproute2 and iptables needed",
    )
    need(docker_ready, "Docker daemon or the test image missing (make images-test)")
    need(not _fleet_in_use(), f"fleet's network guard is in use on this host ({netguard.NETWORK})")
    ns, veth = f"fleet-guard-{os.getpid()}", f"fg{os.getpid() % 10**8}"
    procs: list[subprocess.Popen[str]] = []
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        for address in (f"{NODE_ADDRESS}/30", f"{NODE_LINK_LOCAL}/30"):
            _sh("ip", "addr", "add", address, "dev", veth)
            _sh("ip", "-n", ns, "addr", "add", address.replace(".1/", ".2/"), "dev", "eth0")
        _sh("ip", "link", "set", veth, "up")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        local, node = free_port(), free_port()
        procs.append(
            _serve(
                [
                    sys.executable,
                    "-c",
                    SERVE,
                    f"127.0.0.1:{local}",
                    f"{NODE_ADDRESS}:{node}",
                    f"{NODE_LINK_LOCAL}:{node}",
                ]
            )
        )
        procs.append(
            _serve(["ip", "netns", "exec", ns, sys.executable, "-c", SERVE, f"0.0.0.0:{OUTSIDE_PORT}"])
        )
        yield Around(
            f"127.0.0.1:{local}",
            f"{NODE_ADDRESS}:{node}",
            f"{NODE_LINK_LOCAL}:{node}",
            f"{OUTSIDE}:{OUTSIDE_PORT}",
            f"{OUTSIDE_LINK_LOCAL}:{OUTSIDE_PORT}",
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
        subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture(autouse=True)
def _unguarded_after(around: Around) -> Iterator[None]:
    """Set up before the fleet, so it runs after the fleet and its containers are gone: fleet's
    rules and network are taken off the host, as ``fleet uninstall agent`` does."""
    yield
    netguard.uninstall()
    assert not _fleet_in_use(), "fleet's rules or network are still on the host"


@pytest.fixture
def runtime(docker_runtime: None) -> str:
    return "docker"


@pytest.fixture(params=[True, False], ids=["guarded", "operator-opted-out"])
def guard(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def _agents(procs: FleetProcs, client: Client, guard: bool, count: int = 1) -> None:
    procs.controller()
    for i in range(count):
        procs.agent(
            f"t-guard{i}",
            FLEET_AGENT__JOB_NETWORK_GUARD=str(guard).lower(),
            FLEET_AGENT__JOB_USER=JOB_USER,
            FLEET_AGENT__ADDRESS=NODE_ADDRESS,
        )
    procs.wait_nodes(client, count, timeout=60)


def _reached(output: str) -> dict[str, bool]:
    """What a probe's output says it reached: {host:port: True/False}."""
    found = {}
    for line in output.splitlines():
        target, _, said = line.partition(" ")
        found[target] = said == "hello"
    return found


def _ran(job: object, procs: FleetProcs) -> None:
    status = job.wait(timeout=120)  # type: ignore[attr-defined]
    assert status.state == JobState.SUCCEEDED, (status, procs.logs())


def test_a_job_reaches_the_network_but_neither_its_node_nor_link_local_addresses(
    around: Around, procs: FleetProcs, client: Client, guard: bool
) -> None:
    # Given a Docker node, its network guard on (the default) or turned off by the operator
    _agents(procs, client, guard)
    # When a job tries the node's addresses, a machine outside and the outside's link-local address
    targets = [around.node, around.node_link_local, around.outside, around.outside_link_local]
    job = client.submit(
        JobSpec.parse({"name": "probe", "command": ["sh", "-c", PROBE + 'probe "$@"', "probe", *targets]})
    )
    _ran(job, procs)
    reached = _reached(job.logs())
    # Then it reaches the machine outside either way, and the node and link-local addresses only
    # where the operator turned the guard off
    assert reached == {
        around.outside: True,
        around.node: not guard,
        around.node_link_local: not guard,
        around.outside_link_local: not guard,
    }, job.logs()
    # And fleet doctor on this node says the guard is in place (or off)
    check = network_guard_check(AgentSettings(job_user=JOB_USER, job_network_guard=guard), "docker")
    assert check.status == ("ok" if guard else "warn"), check


def test_two_tenants_jobs_cannot_reach_each_other(
    around: Around, procs: FleetProcs, api: Api, guard: bool
) -> None:
    # Given a Docker node, and a job of tenant a listening on its container's address
    alice, bob = api.client(api.token_for("alice", "a")), api.client(api.token_for("bob", "b"))
    _agents(procs, alice, guard)
    listen = 'echo "at $(hostname -i)"; while true; do echo hello | nc -l -p 8000; done'
    server = alice.submit(JobSpec.parse({"name": "listens", "command": ["sh", "-c", listen]}))
    wait_for(lambda: server.logs().startswith("at "), timeout=60)
    address = f"{server.logs().split()[1]}:8000"
    # When a job of tenant b connects to it
    job = bob.submit(
        JobSpec.parse({"name": "probe", "command": ["sh", "-c", PROBE + 'probe "$@"', "probe", address]})
    )
    _ran(job, procs)
    # Then it got no answer, unless the operator turned the guard off
    assert _reached(job.logs()) == {address: not guard}, job.logs()
    server.cancel()


#: a member of a 2-node job: rank 0 greets at MASTER_ADDR:MASTER_PORT until rank 1 thanks it (a
#: connection that took the greeting unread, or came from elsewhere, does not end its wait), rank 1
#: tries for two minutes (its node may start it long before rank 0's starts rank 0); then each
#: probes what it is given
MEMBER = PROBE + (
    'if [ "$FLEET_NODE_RANK" = 0 ]; then for i in $(seq 240); do '
    'said=$(echo "hello from rank 0" | nc -l -p "$MASTER_PORT") || echo "rank 0 could not listen"; '
    '[ "$said" = thanks ] && break; sleep 0.5; done; else '
    "end=$(($(date +%s) + 120)); while [ $(date +%s) -lt $end ]; do "
    'got=$(echo thanks | nc -w 3 "$MASTER_ADDR" "$MASTER_PORT" 2>/dev/null); '
    '[ -n "$got" ] && break; sleep 0.2; done; echo "rank 0 said: $got"; fi; probe "$@"'
)


def test_members_of_a_multi_node_job_reach_rank_0_but_not_their_nodes_loopback(
    around: Around, procs: FleetProcs, client: Client, guard: bool
) -> None:
    # Given two Docker nodes on this host whose address is a (non-loopback) address of the host
    _agents(procs, client, guard, count=2)
    # When a 2-node job's members (on the host's network) meet, then try the node's loopback
    # services and a link-local address outside
    targets = [around.node_local, around.outside_link_local, around.outside]
    job = client.submit(
        JobSpec.parse(
            {"name": "gang", "nodes": 2, "gpus": 2, "command": ["sh", "-c", MEMBER, "member", *targets]}
        )
    )
    _ran(job, procs)
    # Then rank 1 reached rank 0 at the node's address, as torch.distributed would
    assert job.status().master_addr == NODE_ADDRESS
    assert job.logs(rank=1).startswith("rank 0 said: hello from rank 0\n"), job.logs(rank=1)
    # And neither member reached loopback or the link-local address, unless the guard was off
    for rank in (0, 1):
        lines = "\n".join(line for line in job.logs(rank=rank).splitlines() if not line.startswith("rank 0"))
        expected = {around.node_local: not guard, around.outside_link_local: not guard, around.outside: True}
        assert _reached(lines) == expected, (rank, job.logs(rank=rank))


def test_the_guard_is_installed_once_however_often_agents_start(
    around: Around, procs: FleetProcs, client: Client
) -> None:
    # Given two agents sharing this host's Docker daemon, started at once, then one restarted
    _agents(procs, client, True, count=2)
    procs.procs["t-guard0"].terminate()
    procs.procs["t-guard0"].wait()
    procs.agent("t-guard0", FLEET_AGENT__JOB_USER=JOB_USER, FLEET_AGENT__JOB_NETWORK_GUARD="true")
    log = procs.root / "t-guard0.log"
    wait_for(lambda: log.read_text().count("runtime_chosen") == 2, timeout=60)
    # Then the host holds one network of fleet's and each rule once
    networks = subprocess.run(
        ["docker", "network", "ls", "--format", "{{.Name}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert networks.count(netguard.NETWORK) == 1
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=30, check=True).stdout
    for chain in (netguard.CHAIN_INPUT, netguard.CHAIN_FORWARD, netguard.CHAIN_OUTPUT):
        assert rules.count(f"-j {chain}") == 1, rules
    assert rules.count(f"-A {netguard.CHAIN_OUTPUT} ") == 3, rules  # replies; loopback; 169.254.0.0/16
