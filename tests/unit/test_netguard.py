"""The network guard's rules as generated, and its settings (tests/integration/test_hostile_network.py
runs them against real iptables and Docker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.agent import netguard
from fleet.agent.netguard import BRIDGE, CHAIN_FORWARD, CHAIN_INPUT, CHAIN_OUTPUT, guarded_uids, plan
from fleet.config import load_settings
from fleet.config_sections import AgentSettings
from fleet.errors import ConfigError
from fleet.ops.doctor.host import network_guard_check

REPLIES = ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN")
BLOCKED = ["169.254.0.0/16", "fe80::/10", "10.20.0.0/16"]


def test_bridge_jobs_reach_the_node_only_with_replies_and_no_blocked_network() -> None:
    rules = plan(4, "1000000000-1000999999", BLOCKED)
    # the node itself: replies to what it opened, nothing else
    assert rules.chains[CHAIN_INPUT] == [REPLIES, ("-j", "REJECT")]
    # forwarded: replies; nothing to another container of the bridge; no IPv4 blocked network
    assert rules.chains[CHAIN_FORWARD] == [
        REPLIES,
        ("-o", BRIDGE, "-j", "DROP"),
        ("-d", "169.254.0.0/16", "-j", "REJECT"),
        ("-d", "10.20.0.0/16", "-j", "REJECT"),
    ]
    # the chains are reached from the bridge's packets only, first in their built-in chains
    assert rules.jumps == [
        ("INPUT", ("-i", BRIDGE, "-j", CHAIN_INPUT)),
        ("DOCKER-USER", ("-i", BRIDGE, "-j", CHAIN_FORWARD)),
        ("OUTPUT", ("-j", CHAIN_OUTPUT)),
    ]


def test_job_uids_on_the_hosts_network_are_kept_off_loopback_and_blocked_networks() -> None:
    owner = ("-m", "owner", "--uid-owner", "1000000000-1000999999")
    assert plan(4, "1000000000-1000999999", BLOCKED).chains[CHAIN_OUTPUT] == [
        REPLIES,
        ("-d", "127.0.0.0/8", *owner, "-j", "REJECT"),
        ("-d", "169.254.0.0/16", *owner, "-j", "REJECT"),
        ("-d", "10.20.0.0/16", *owner, "-j", "REJECT"),
    ]


def test_ipv6_gets_its_own_loopback_and_networks_and_forward_where_docker_made_no_chain() -> None:
    rules = plan(6, "65534", BLOCKED, forward="FORWARD")
    assert rules.chains[CHAIN_FORWARD][2:] == [("-d", "fe80::/10", "-j", "REJECT")]
    assert rules.chains[CHAIN_OUTPUT][1:] == [
        ("-d", "::1/128", "-m", "owner", "--uid-owner", "65534", "-j", "REJECT"),
        ("-d", "fe80::/10", "-m", "owner", "--uid-owner", "65534", "-j", "REJECT"),
    ]
    assert ("FORWARD", ("-i", BRIDGE, "-j", CHAIN_FORWARD)) in rules.jumps


def test_the_guarded_uids_are_the_fixed_job_users_else_the_tenants_range() -> None:
    assert guarded_uids(AgentSettings(job_user="1234:99")) == "1234"
    # jobs run as root (fleet up started by root): no rule on root's packets, or the node's own
    # services would lose loopback (Redis, the agent, the API)
    assert guarded_uids(AgentSettings(job_user="0", allow_root_jobs=True)) is None
    assert plan(4, None, BLOCKED).chains[CHAIN_OUTPUT] == [plan(4, "1", BLOCKED).chains[CHAIN_OUTPUT][0]]
    assert guarded_uids(AgentSettings(job_user="", job_uid_range="2000000000-2000000999")) == (
        "2000000000-2000000999"
    )


def test_guard_settings_default_on_and_a_bad_network_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = load_settings().agent
    assert agent.job_network_guard and agent.job_blocked_networks == ["169.254.0.0/16", "fe80::/10"]
    monkeypatch.setenv("FLEET_AGENT__JOB_BLOCKED_NETWORKS", '["10.0.0.1/8", "fd00:ec2::254"]')
    assert load_settings().agent.job_blocked_networks == ["10.0.0.0/8", "fd00:ec2::254/128"]
    monkeypatch.setenv("FLEET_AGENT__JOB_BLOCKED_NETWORKS", '["metadata"]')
    with pytest.raises(ConfigError, match=r"agent\.job_blocked_networks: .*'metadata' is not a network"):
        load_settings()


def test_doctor_warns_when_the_operator_turned_the_guard_off_and_skips_the_process_runtime() -> None:
    off = network_guard_check(AgentSettings(job_network_guard=False), "docker")
    assert off.status == "warn" and "Docker jobs reach this node's services" in off.detail
    assert off.fix == "set agent.job_network_guard = true"
    assert network_guard_check(AgentSettings(), "process").status == "skip"


def test_fleet_ups_release_leaves_the_guard_while_another_agent_of_the_host_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netguard, "LOCK", tmp_path / "netguard.lock")
    monkeypatch.setattr(netguard, "USERS", tmp_path / "netguard.users")
    taken: list[str] = []

    def uninstall() -> list[str]:  # the host's own rules and network stay as they are here
        taken.append("off")
        return ["removed"]

    monkeypatch.setattr(netguard, "uninstall", uninstall)
    # Given an agent that uses the guard, as each Docker agent does from its first ensure()
    agent = netguard.NetGuard(None, AgentSettings(state_dir=tmp_path / "agent"))
    agent._hold()
    assert (tmp_path / "agent" / netguard.MARKER).exists()  # what tells fleet up its agent had one
    # When fleet up, stopping, would take it off: it is left on
    assert netguard.release() == [] and taken == []
    # Once no agent holds it (the agent exited: the kernel lets go of its lock), it comes off
    assert agent._users is not None
    agent._users.close()
    assert netguard.release() == ["removed"] and taken == ["off"]
