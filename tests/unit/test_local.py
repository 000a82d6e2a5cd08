"""`fleet up`'s children die with it: the parent-death signal, where Linux offers it; its jobs run
as the person who started it."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.ops.local import die_with_parent, free_port, jobs_run_as
from fleet.ops.redis_local import PORTS_FROM

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
PR_GET_PDEATHSIG = 2
READ_PDEATHSIG = (
    "import ctypes; v = ctypes.c_int(); "
    f"ctypes.CDLL(None).prctl({PR_GET_PDEATHSIG}, ctypes.byref(v)); print(v.value)"
)


@linux_only
def test_a_child_spawned_with_it_gets_sigterm_when_the_parent_dies() -> None:
    # Given the preexec hook
    preexec = die_with_parent()

    # When a child is spawned with it
    out = subprocess.run(
        [sys.executable, "-c", READ_PDEATHSIG],
        preexec_fn=preexec,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    # Then the kernel will send it SIGTERM
    assert int(out.stdout) == signal.SIGTERM


@linux_only
def test_a_child_whose_parent_already_died_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a hook made by a parent that is no longer this child's parent (it died before prctl)
    with monkeypatch.context() as m:
        m.setattr(os, "getpid", lambda: 1)
        preexec = die_with_parent()

    # When a child is spawned with it
    child = subprocess.Popen(
        [sys.executable, "-c", "print('ran')"], preexec_fn=preexec, stdout=subprocess.PIPE, text=True
    )
    out, _ = child.communicate(timeout=60)

    # Then it exits as SIGTERM would have made it, before running anything
    assert (child.returncode, out) == (128 + signal.SIGTERM, "")


def test_without_prctl_children_are_spawned_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a system without prctl
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(ctypes, "CDLL", None)  # would fail loudly if still looked up

    # When / Then there is no hook to run in the child
    assert die_with_parent() is None


def test_fleet_ups_jobs_run_as_a_job_user_given_in_the_environment() -> None:
    assert jobs_run_as({"FLEET_AGENT__JOB_USER": "1234:1234", "SUDO_USER": "nobody"}) == ({}, "")


def test_a_sudo_user_that_is_no_user_of_the_machine_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet.ops.local.os.geteuid", lambda: 0)
    with pytest.raises(ConfigError, match=r"SUDO_USER='no-such-user-x' names no user of this machine"):
        jobs_run_as({"SUDO_USER": "no-such-user-x"})


def test_an_unprivileged_start_runs_jobs_as_itself_and_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("geteuid", 1000), ("getuid", 1000), ("getgid", 1001)):
        monkeypatch.setattr(f"fleet.ops.local.os.{name}", lambda value=value: value)
    assert jobs_run_as({"SUDO_USER": "nobody"}) == ({"FLEET_AGENT__JOB_USER": "1000:1001"}, "")


def test_free_ports_come_from_below_the_kernels_ephemeral_range_and_never_twice() -> None:
    # a port picked from the ephemeral range can be taken by any connection or bind to port 0
    # before its server binds it; below it, only an explicit bind competes
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    if low - PORTS_FROM >= 1000:
        assert all(PORTS_FROM <= port < low for port in ports)
    # and each was free: a server binds it
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
