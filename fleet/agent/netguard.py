"""Keeps Docker jobs off the node's own services and off the networks they may not reach.

Single-node jobs run on fleet's Docker network, :data:`NETWORK`: a bridge named :data:`BRIDGE` with
inter-container communication off, so no container on it reaches another. Rules in fleet's own
chains, jumped to from the built-in ones, keep that bridge's containers off the node itself (any of
its addresses: its Redis, the agent's metrics, a Docker API) and off ``agent.job_blocked_networks``
(169.254.169.254, the cloud's metadata service). Members of multi-node jobs run on the host's
network, where rank 0 listens on the node's address; they are kept off loopback (where node-local
services listen) and the blocked networks by the uids jobs run as. Replies to connections the node
opened always pass.

    INPUT        -i fleet0 -j FLEET-INPUT      RELATED,ESTABLISHED: RETURN; else REJECT
    DOCKER-USER  -i fleet0 -j FLEET-FORWARD    RELATED,ESTABLISHED: RETURN; to fleet0: DROP;
    (FORWARD where Docker made no DOCKER-USER)  to a blocked network: REJECT
    OUTPUT       -j FLEET-OUTPUT               RELATED,ESTABLISHED: RETURN; a job uid to loopback
                                               or a blocked network: REJECT

The same for IPv6 where ``ip6tables`` works. Everything is idempotent and checked before it is
changed (``-C`` before ``-I``), under a lock, so several agents sharing a host and its Docker
daemon converge on one network and one set of rules. Only the Docker runtime installs them: the
process runtime isolates nothing.

The rules and the network outlive the agent (a node's agent restarts with its jobs running). Each
agent that ensured them holds a shared lock on :data:`USERS` while it lives and records so in its
state dir (:data:`MARKER`): ``fleet up`` takes them off when it stops (:func:`release`), unless
another agent of the host still holds that lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleet.config_sections import AgentSettings
from fleet.errors import ConfigError
from fleet.log import event

log = logging.getLogger("fleet.agent.netguard")

#: the Docker network single-node jobs run on, and its bridge's interface name (both fixed: every
#: agent of a host shares them, and the rules name the interface)
NETWORK = "fleet-jobs"
BRIDGE = "fleet0"
NETWORK_OPTIONS = {"com.docker.network.bridge.name": BRIDGE, "com.docker.network.bridge.enable_icc": "false"}
LABEL = "fleet.network"
CHAIN_INPUT, CHAIN_FORWARD, CHAIN_OUTPUT = "FLEET-INPUT", "FLEET-FORWARD", "FLEET-OUTPUT"
TOOLS = {4: "iptables", 6: "ip6tables"}
LOOPBACK = {4: "127.0.0.0/8", 6: "::1/128"}
LOCK = Path("/run/fleet-netguard.lock")
#: every agent that uses the guard holds a shared lock on it while it lives (the kernel lets go of a
#: dead one's): the guard is taken off only when nobody holds it
USERS = Path("/run/fleet-netguard.users")
#: in an agent's state dir: that agent ensured the guard (what ``fleet up`` takes off when it stops)
MARKER = "netguard"
#: the rules are checked again at a launch at most this often (a firewall reload drops them)
RECHECK_S = 60.0
_REPLIES = ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN")


class GuardError(Exception):
    """iptables refused a rule."""


@dataclass(frozen=True)
class Plan:
    """The rules of one address family: fleet's chains, each with its rules in order, and the
    jumps to them (built-in chain, rule) put first in their chain."""

    family: int
    chains: dict[str, list[tuple[str, ...]]]
    jumps: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)


def plan(family: int, uids: str | None, blocked: Sequence[str], forward: str = "DOCKER-USER") -> Plan:
    """Pure: the rules for ``family`` (4 or 6). ``uids`` is what jobs on the host's network run as
    (``uid`` or ``first-last``; None when they run as root: no owner rule then, see
    :func:`guarded_uids`); ``blocked`` the networks jobs may not reach (those of other families are
    left out); ``forward`` the chain forwarded packets meet first."""
    nets = [n for n in blocked if ipaddress.ip_network(n, strict=False).version == family]
    owner = ("-m", "owner", "--uid-owner", uids or "")
    targets = [] if uids is None else [LOOPBACK[family], *nets]
    return Plan(
        family,
        {
            CHAIN_INPUT: [_REPLIES, ("-j", "REJECT")],
            CHAIN_FORWARD: [
                _REPLIES,
                ("-o", BRIDGE, "-j", "DROP"),
                *(("-d", n, "-j", "REJECT") for n in nets),
            ],
            CHAIN_OUTPUT: [_REPLIES, *(("-d", n, *owner, "-j", "REJECT") for n in targets)],
        },
        [
            ("INPUT", ("-i", BRIDGE, "-j", CHAIN_INPUT)),
            (forward, ("-i", BRIDGE, "-j", CHAIN_FORWARD)),
            ("OUTPUT", ("-j", CHAIN_OUTPUT)),
        ],
    )


def guarded_uids(cfg: AgentSettings) -> str | None:
    """The uids jobs run as, for ``--uid-owner``: the fixed ``job_user``'s where one is set, else
    ``job_uid_range`` (one uid per tenant). None for jobs run as root (``job_user = "0"``, as `fleet
    up` started by root does): a rule on root's packets would cut the node's own services (Redis,
    the agent, the API) off loopback, so host-network jobs of such a node are not kept off it."""
    if cfg.fixed_user is not None:
        return None if cfg.fixed_user[0] == 0 else str(cfg.fixed_user[0])
    start, count = cfg.uid_range
    return f"{start}-{start + count - 1}"


# -- iptables --------------------------------------------------------------------------


def _run(family: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLS[family], "-w", "10", *args], capture_output=True, text=True, timeout=60)


def _must(family: int, *args: str) -> None:
    done = _run(family, *args)
    if done.returncode != 0:
        raise GuardError(f"{TOOLS[family]} {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def families() -> list[int]:
    """The address families whose tool is installed and works here (IPv6 may be off in the kernel)."""
    found = []
    for family, tool in TOOLS.items():
        if shutil.which(tool) is not None and _run(family, "-S", "INPUT").returncode == 0:
            found.append(family)
    return found


def forward_chain(family: int) -> str:
    """DOCKER-USER where Docker made it (Docker keeps it first in FORWARD and never edits it)."""
    return "DOCKER-USER" if _run(family, "-S", "DOCKER-USER").returncode == 0 else "FORWARD"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One agent of a host at a time changes the rules or the network."""
    try:
        f = open(LOCK, "a")  # noqa: SIM115 - closed below
    except OSError:  # not root: it changes no rules, and Docker serialises its own part
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def install(p: Plan) -> bool:
    """Make the rules of ``p`` be there; True when something had to change. A chain whose rules
    are all there, and no others, is left alone; else it is refilled."""
    changed = False
    for chain, rules in p.chains.items():
        made = _run(p.family, "-N", chain)
        if made.returncode != 0 and "exists" not in made.stderr:
            raise GuardError(f"{TOOLS[p.family]} -N {chain}: {made.stderr.strip()}")
        listed = _run(p.family, "-S", chain).stdout.splitlines()
        present = [line for line in listed if line.startswith("-A ")]
        if len(present) == len(rules) and all(_run(p.family, "-C", chain, *r).returncode == 0 for r in rules):
            continue
        changed = True
        _must(p.family, "-F", chain)
        for rule in rules:
            _must(p.family, "-A", chain, *rule)
    for builtin, rule in p.jumps:
        if _run(p.family, "-C", builtin, *rule).returncode != 0:
            changed = True
            _must(p.family, "-I", builtin, "1", *rule)
    return changed


def installed(p: Plan) -> list[str]:
    """What of ``p`` is missing here, in words ([] when all of it is there)."""
    missing = []
    for chain, rules in p.chains.items():
        if any(_run(p.family, "-C", chain, *r).returncode != 0 for r in rules):
            missing.append(f"rules of {chain}")
    missing += [f"{b} -> {r[-1]}" for b, r in p.jumps if _run(p.family, "-C", b, *r).returncode != 0]
    return [f"{TOOLS[p.family]}: {m}" for m in missing]


def remove_rules(family: int) -> None:
    """Take fleet's chains and every jump to them out of ``family``'s tables."""
    jumps = {jump for forward in ("DOCKER-USER", "FORWARD") for jump in plan(family, "0", [], forward).jumps}
    for builtin, rule in sorted(jumps):
        while _run(family, "-C", builtin, *rule).returncode == 0:
            _must(family, "-D", builtin, *rule)
    for chain in (CHAIN_INPUT, CHAIN_FORWARD, CHAIN_OUTPUT):
        _run(family, "-F", chain)
        _run(family, "-X", chain)


# -- the Docker network ----------------------------------------------------------------


def _network(client: Any) -> Any:
    found = [n for n in client.networks.list(names=[NETWORK]) if n.name == NETWORK]
    return client.networks.get(found[0].id) if found else None


def ensure_network(client: Any) -> None:
    """Fleet's network, made if missing (by whichever agent of the host gets there first)."""
    from docker.errors import APIError

    network = _network(client)
    if network is None:
        try:
            client.networks.create(
                NETWORK,
                driver="bridge",
                options=NETWORK_OPTIONS,
                labels={LABEL: "jobs"},
                check_duplicate=True,
            )
            event(log, "job_network_created", network=NETWORK, bridge=BRIDGE)
        except APIError as exc:  # another agent made it meanwhile: fine if it is there now
            if _network(client) is None:
                raise
            log.debug("%s made by another agent: %s", NETWORK, exc)
        network = _network(client)
    options = network.attrs.get("Options") or {}
    wrong = {k: options.get(k) for k, v in NETWORK_OPTIONS.items() if options.get(k) != v}
    if wrong:
        raise ConfigError(
            f"Docker network {NETWORK} exists with other options than fleet's ({wrong}); jobs on it would "
            f"not be guarded: remove it (docker network rm {NETWORK}) and restart the agent, which makes it"
        )


def remove_network(client: Any) -> bool:
    """Remove fleet's network; False when a container still uses it (Docker refuses)."""
    from docker.errors import APIError, NotFound

    network = _network(client)
    if network is None:
        return True
    try:
        network.remove()
    except NotFound:
        pass
    except APIError:
        return False
    return True


# -- the agent's part ------------------------------------------------------------------


class NetGuard:
    """The guard as an agent runs it: installed at start, checked again at launches now and then;
    where it cannot be (no iptables, not root) it says so once and jobs run unguarded."""

    def __init__(self, client: Any, cfg: AgentSettings) -> None:
        self.client, self.cfg = client, cfg
        self.uids = guarded_uids(cfg)
        self._checked = float("-inf")
        self._said: set[str] = set()
        self._users: IO[str] | None = None
        self._held = False

    def ensure(self) -> str:
        """Make sure of the network and (now and then) the rules; the network bridge jobs join."""
        if not self._held:
            self._hold()
        with _locked():
            ensure_network(self.client)
            if time.monotonic() - self._checked >= RECHECK_S:
                self._rules()
                self._checked = time.monotonic()
        return NETWORK

    def _hold(self) -> None:
        """Say that this agent uses the guard, for as long as it lives (a shared lock on
        :data:`USERS`; waits while :func:`release` takes it off), and record so in its state dir."""
        self._held = True
        try:
            self._users = open(USERS, "a")  # noqa: SIM115 - held open, and locked, until the agent exits
            fcntl.flock(self._users, fcntl.LOCK_SH)
        except OSError:  # not root: it installs no rules
            self._users = None
        with contextlib.suppress(OSError):
            self.cfg.state_dir.mkdir(parents=True, exist_ok=True)
            (self.cfg.state_dir / MARKER).write_text(f"{NETWORK} {os.getpid()}\n")

    def _rules(self) -> None:
        found = families() if os.geteuid() == 0 else []
        if os.geteuid() != 0:
            self._once(
                "not_root",
                "the agent is not root: it cannot install the rules that keep Docker jobs "
                "off this node's services and the blocked networks",
            )
        elif 4 not in found:
            self._once(
                "no_iptables",
                "iptables not found (or not working): Docker jobs can reach this "
                "node's services and the blocked networks; install iptables",
            )
            found = []
        if found and self.uids is None:
            self._once(
                "root_jobs",
                "jobs run as root (job_user 0): host-network jobs are not kept off this node's "
                "loopback services (that rule would cut the node's own services off too)",
            )
        for family in found:
            try:
                p = plan(family, self.uids, self.cfg.job_blocked_networks, forward_chain(family))
                if install(p):
                    event(
                        log,
                        "job_network_guarded",
                        family=f"ipv{family}",
                        uids=self.uids,
                        blocked=",".join(self.cfg.job_blocked_networks),
                    )
            except (GuardError, OSError, subprocess.SubprocessError) as exc:
                self._once(f"failed{family}", f"the rules of ipv{family} could not be installed: {exc}")

    def _once(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            event(log, "job_network_unguarded", logging.WARNING, reason=text)


def release() -> list[str]:
    """Take fleet's rules and network off this host unless an agent still uses them (holds
    :data:`USERS`): what ``fleet up`` does when it stops, its own agent stopped; what was done or
    left, in words ([] while another agent uses them)."""
    with _locked():
        try:
            users = open(USERS, "a")  # noqa: SIM115 - closed below
        except OSError:  # not root: no rules to take off, nor a lock to ask (the network goes if
            return uninstall()  # no container uses it; an agent's next launch makes it again)
        with users:
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []
            return uninstall()


def uninstall() -> list[str]:
    """Take fleet's rules and network off this host (``fleet uninstall agent``); what was done or
    left, in words."""
    done = []
    if os.geteuid() == 0:
        for family in families():
            remove_rules(family)
            done.append(f"removed fleet's {TOOLS[family]} rules")
    try:
        import docker
        from docker.errors import DockerException

        client = docker.from_env(timeout=10)
    except (ImportError, DockerException):
        return done
    try:
        if _network(client) is not None:
            gone = remove_network(client)
            done.append(
                f"removed Docker network {NETWORK}" if gone else f"kept Docker network {NETWORK}: in use"
            )
    except DockerException:
        pass
    finally:
        client.close()
    return done
