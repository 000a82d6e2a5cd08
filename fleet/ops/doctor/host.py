"""The host's checks: cgroups, the network guard that keeps Docker jobs off this node's services,
and the ports and address of multi-node jobs."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.agent import cgroups
from fleet.config_sections import AgentSettings
from fleet.errors import ConfigError
from fleet.ops.doctor.report import FAIL, OK, SKIP, WARN, Check


def network_guard_check(cfg: AgentSettings, runtime: str | None, client: Any = None) -> Check:
    """Whether the rules and the network that keep Docker jobs off this node's services are there
    (the agent installs them when it starts; this only looks)."""
    from fleet.agent import netguard

    name, blocked = "network guard", ", ".join(cfg.job_blocked_networks) or "no network"
    if runtime != "docker":
        return Check(name, SKIP, "not used by the process runtime (its jobs share the node's network)")
    if not cfg.job_network_guard:
        return Check(
            name,
            WARN,
            f"off (agent.job_network_guard = false): Docker jobs reach this node's services, each other "
            f"and {blocked}",
            "set agent.job_network_guard = true",
        )
    if os.geteuid() != 0:
        return Check(name, WARN, "cannot read the firewall: not root", "run fleet doctor as root")
    found = netguard.families()
    if 4 not in found:
        return Check(
            name,
            WARN,
            f"iptables not found: Docker jobs reach this node's services and {blocked}",
            "install iptables and restart the agent",
        )
    try:
        uids = netguard.guarded_uids(cfg)
    except ConfigError as exc:
        return Check(name, FAIL, str(exc), "fix agent.job_uid_range")
    missing = []
    for family in found:
        rules = netguard.plan(family, uids, cfg.job_blocked_networks, netguard.forward_chain(family))
        missing += netguard.installed(rules)
    import docker
    from docker.errors import DockerException

    try:
        client = client or docker.from_env(timeout=30)
        if not client.networks.list(names=[netguard.NETWORK]):
            missing.append(f"Docker network {netguard.NETWORK}")
    except DockerException as exc:
        missing.append(f"Docker network {netguard.NETWORK} ({exc})")
    if missing:
        return Check(
            name,
            WARN,
            f"not in place: {', '.join(missing)}",
            "start (or restart) the agent as root: it installs them when it starts and checks them "
            "again at launches",
        )
    families = " and ".join(netguard.TOOLS[f] for f in found)
    network = f"{netguard.NETWORK} (bridge {netguard.BRIDGE})"
    return Check(
        name,
        OK,
        f"jobs on {network} reach neither this node nor each other; uids {uids} "
        f"kept off loopback; {blocked} blocked ({families})",
    )


def cgroup_check(
    runtime: str | None, root: Path = cgroups.ROOT, mounts: Path = cgroups.MOUNTS, euid: int | None = None
) -> Check:
    """Docker: cgroup v2, with the controllers Docker limits jobs through (memory, cpu, pids). The
    process runtime: cgroups fleet can make attempts' in (see :func:`process_cgroup_check`)."""
    if runtime == "process":
        return process_cgroup_check(cgroups.detect(root, mounts, euid))
    if runtime != "docker":
        return Check("cgroups", SKIP, "no runtime opens (see the runtime line)")
    try:
        found = set((root / "cgroup.controllers").read_text().split())
    except FileNotFoundError:
        return Check(
            "cgroups",
            WARN,
            f"cgroup v1 ({root}/cgroup.controllers is missing): Docker limits jobs with "
            "v1 controllers, which Docker and systemd are dropping",
            "boot with systemd.unified_cgroup_hierarchy=1 (the default of current distributions)",
        )
    except OSError as exc:
        return Check("cgroups", WARN, f"cannot read {root}/cgroup.controllers: {exc.strerror}")
    limits = {"memory": "memory", "cpu": "cpus", "pids": "pids_limit"}
    missing = [f"{c} ({what})" for c, what in limits.items() if c not in found]
    if missing:
        return Check(
            "cgroups",
            WARN,
            f"cgroup v2 without {', '.join(missing)}: those limits are not enforced",
            "enable the controllers (a kernel booted with cgroup_disable=...? see /proc/cmdline)",
        )
    return Check("cgroups", OK, f"cgroup v2: {' '.join(sorted(found))}")


def process_cgroup_check(layout: cgroups.Layout) -> Check:
    """Whether the process runtime can put each attempt in a cgroup: limits, and a kill that reaches
    every process of a job (without, a child in a session of its own outlives its job)."""
    if layout.kind == "none":
        return Check(
            "cgroups",
            WARN,
            f"{layout.describe()}: process-runtime jobs are not limited (memory, CPUs, "
            "processes) and are killed by process group, which a child in a session of its own escapes",
            "run the agent as root on a host with /sys/fs/cgroup mounted read-write (cgroup v2 or hybrid)",
        )
    if layout.kind == "v2" and layout.unified is not None:
        try:
            offered = set((layout.unified / "cgroup.controllers").read_text().split())
        except OSError:
            offered = set()
    else:
        offered = set(layout.v1)
    missing = [c for c in cgroups.CONTROLLERS if c not in offered]
    if missing:
        return Check(
            "cgroups",
            WARN,
            f"{layout.describe()}, without {', '.join(missing)}: those limits are not enforced",
            "enable the controllers (a kernel booted with cgroup_disable=...? see /proc/cmdline)",
        )
    if layout.kind == "v1":
        return Check(
            "cgroups",
            WARN,
            f"{layout.describe()}: limits hold, but a job is killed pid by pid (no cgroup.kill)",
            "mount cgroup2 (boot with systemd.unified_cgroup_hierarchy=1)",
        )
    return Check("cgroups", OK, f"{layout.describe()}: each attempt in a cgroup; memory, cpu, pids limited")


def port_check(
    base: int,
    count: int,
    local_range: Path = Path("/proc/sys/net/ipv4/ip_local_port_range"),
    bindable: Callable[[int], bool] | None = None,
) -> Check:
    """The ports a multi-node job's rank 0 may listen on (controller.rendezvous_port_base and
    rendezvous_ports) can be bound here, and the kernel does not hand them to outgoing connections."""
    last = base + count - 1
    span = f"{base}-{last}" if count > 1 else str(base)
    taken = [p for p in range(base, last + 1) if not (bindable or _bindable)(p)]
    move = "set controller.rendezvous_port_base (and rendezvous_ports) to a free range on every node"
    if len(taken) == count:
        return Check("gang ports", FAIL, f"none of ports {span} can be bound", move)
    notes = []
    if taken:
        shown = ", ".join(map(str, taken[:5])) + (", ..." if len(taken) > 5 else "")
        notes.append(f"{len(taken)} in use ({shown}): a multi-node job given one fails to start")
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, local_range.read_text().split())
        if low <= last and base <= high:
            notes.append(f"they overlap the kernel's ephemeral ports {low}-{high} (for outgoing connections)")
            move = f"sysctl net.ipv4.ip_local_reserved_ports={span}, or {move}"
    if notes:
        return Check("gang ports", WARN, f"ports {span}: {'; '.join(notes)}", move)
    return Check("gang ports", OK, f"ports {span} free (controller.rendezvous_port_base)")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def address_check(cfg: AgentSettings) -> Check:
    """Where the other members of a multi-node job reach this node (MASTER_ADDR when it holds rank 0)."""
    from fleet.agent.service import address_of

    name, fix = "gang address", "set agent.address to this node's address on the fleet's network"
    given = f"agent.address = {cfg.address}" if cfg.address else f"what {cfg.node_name} resolves to"
    try:
        address = ipaddress.ip_address(socket.gethostbyname(cfg.address or cfg.node_name))
    except OSError:
        if cfg.address:
            return Check(name, FAIL, f"agent.address {cfg.address} does not resolve", fix)
        address = ipaddress.ip_address(address_of(cfg.node_name))
        given = f"{cfg.node_name} does not resolve; the host name's address"
    if address.is_loopback:
        return Check(
            name,
            WARN,
            f"{address} ({given}): members of a multi-node job on other nodes cannot reach a rank 0 here",
            f"{fix} (or make {cfg.node_name} resolve to it)",
        )
    return Check(name, OK, f"{address} ({given})")
