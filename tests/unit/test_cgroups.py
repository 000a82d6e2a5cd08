"""Attempt cgroups (fleet.agent.cgroups): the layout read from the mount table, the files an attempt's
limits become, OOM reports and kills, against a directory tree laid out as cgroupfs is; and once
against the host's real cgroups, where they are writable."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.agent import cgroups, supervisor
from fleet.agent.cgroups import Cgroups, Layout, Limits, detect
from fleet.agent.supervisor import kill_cgroup, kill_leftovers
from fleet.errors import LaunchError

MiB = 1 << 20


def mounts(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "mounts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def v2_tree(root: Path, controllers: str = "cpuset cpu io memory pids") -> None:
    """What the kernel shows at a cgroup2 root and in the directories fleet makes below it."""
    for folder in (root, root / "fleet", root / "fleet" / "n1"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup.controllers").write_text(f"{controllers}\n")
        (folder / "cgroup.subtree_control").write_text("")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


# -- the layout -------------------------------------------------------------------------


def test_cgroup2_at_the_root_is_v2(tmp_path: Path) -> None:
    table = mounts(tmp_path, f"cgroup2 {tmp_path} cgroup2 rw,nosuid,nodev,noexec,relatime 0 0")
    assert detect(tmp_path, table, euid=0) == Layout("v2", tmp_path)


def test_cgroup2_under_unified_with_v1_controllers_is_hybrid(tmp_path: Path) -> None:
    for name in ("unified", "memory", "cpu,cpuacct", "pids", "freezer"):
        (tmp_path / name).mkdir()
    table = mounts(
        tmp_path,
        f"tmpfs {tmp_path} tmpfs rw 0 0",
        f"cgroup2 {tmp_path}/unified cgroup2 rw,relatime 0 0",
        f"cgroup {tmp_path}/memory cgroup rw,relatime,memory 0 0",
        f"cgroup {tmp_path}/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0",
        f"cgroup {tmp_path}/pids cgroup rw,relatime,pids 0 0",
        f"cgroup {tmp_path}/freezer cgroup rw,relatime,freezer 0 0",
    )
    layout = detect(tmp_path, table, euid=0)
    assert layout.kind == "hybrid" and layout.unified == tmp_path / "unified"
    assert layout.v1 == {
        "memory": tmp_path / "memory",
        "cpu": tmp_path / "cpu,cpuacct",
        "pids": tmp_path / "pids",
    }


def test_v1_controllers_alone_are_v1(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    table = mounts(tmp_path, f"cgroup {tmp_path}/memory cgroup rw,memory 0 0")
    assert detect(tmp_path, table, euid=0) == Layout("v1", None, {"memory": tmp_path / "memory"})


def test_no_cgroups_for_an_agent_that_is_not_root_or_a_host_without_them(tmp_path: Path) -> None:
    table = mounts(tmp_path, f"cgroup2 {tmp_path} cgroup2 rw 0 0")
    assert detect(tmp_path, table, euid=1000) == Layout("none", why="the agent is not root")
    other = tmp_path / "elsewhere"
    assert detect(other, table, euid=0) == Layout("none", why=f"no cgroup filesystem mounted at {other}")
    assert detect(tmp_path, tmp_path / "missing", euid=0).kind == "none"


# -- an attempt's cgroups -----------------------------------------------------------------


def test_v2_enables_the_controllers_down_the_chain_and_writes_the_limits(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    leaf = tmp_path / "fleet" / "n1" / "job-1.2"
    leaf.mkdir()
    for name in ("memory.swap.max", "cgroup.kill"):
        (leaf / name).write_text("max\n")
    groups = Cgroups(Layout("v2", tmp_path), "fleet", "n1")

    joined = groups.create("job-1.2", Limits(memory=64 * MiB, cpus=1.5, pids=100))

    for folder in (tmp_path, tmp_path / "fleet", tmp_path / "fleet" / "n1"):
        assert (folder / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (leaf / "memory.max").read_text() == str(64 * MiB)
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "cpu.max").read_text() == "150000 100000"
    assert (leaf / "pids.max").read_text() == "100"
    assert joined.procs == [str(leaf / "cgroup.procs")] and joined.kill == str(leaf / "cgroup.kill")


def test_v2_without_swap_accounting_or_limits_writes_only_what_there_is(tmp_path: Path) -> None:
    v2_tree(tmp_path, "memory pids")
    groups = Cgroups(Layout("v2", tmp_path), "fleet", "n1")
    joined = groups.create("job-1.1", Limits(memory=64 * MiB))
    leaf = tmp_path / "fleet" / "n1" / "job-1.1"
    assert sorted(p.name for p in leaf.iterdir()) == ["memory.max"]
    assert (tmp_path / "fleet" / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert joined.kill is None  # a kernel before 5.14: the supervisor signals each pid


def test_hybrid_joins_the_unified_cgroup_first_and_limits_in_v1(tmp_path: Path) -> None:
    layout = Layout("hybrid", tmp_path / "unified", {c: tmp_path / c for c in ("memory", "cpu", "pids")})
    for mount in ("unified", "cpu", "pids"):
        (tmp_path / mount).mkdir()
    memory = tmp_path / "memory" / "fleet" / "n1" / "job-1.1"
    memory.mkdir(parents=True)
    (memory / "memory.memsw.limit_in_bytes").write_text("9223372036854771712\n")
    groups = Cgroups(layout, "fleet", "n1")

    joined = groups.create("job-1.1", Limits(memory=128 * MiB, cpus=0.5, pids=64))

    assert joined.procs == [
        str(tmp_path / h / "fleet" / "n1" / "job-1.1" / "cgroup.procs")
        for h in ("unified", "pids", "memory", "cpu")
    ]
    assert (memory / "memory.limit_in_bytes").read_text() == str(128 * MiB)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(128 * MiB)
    cpu = tmp_path / "cpu" / "fleet" / "n1" / "job-1.1"
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
    assert (tmp_path / "pids" / "fleet" / "n1" / "job-1.1" / "pids.max").read_text() == "64"
    assert list((tmp_path / "unified" / "fleet" / "n1" / "job-1.1").iterdir()) == []  # membership only
    assert groups.node_dirs()[0] == tmp_path / "unified" / "fleet" / "n1"


def test_a_cgroup_that_cannot_be_made_is_a_retryable_launch_error(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory\n")  # no cgroup.subtree_control: not cgroupfs
    with pytest.raises(LaunchError, match="cannot set up the attempt's cgroup") as raised:
        Cgroups(Layout("v2", tmp_path), "fleet", "n1").create("job-1.1", Limits(memory=64 * MiB))
    assert raised.value.retryable


def test_without_cgroups_nothing_is_made_or_killed(tmp_path: Path) -> None:
    groups = Cgroups(Layout("none", why="the agent is not root"), "fleet", "n1")
    assert groups.create("job-1.1", Limits(memory=64 * MiB)).procs == []
    assert (
        groups.node_dirs() == [] and groups.members("job-1.1") == [] and groups.oom_limit("job-1.1") is None
    )
    groups.kill("job-1.1")
    groups.remove("job-1.1")
    assert list(tmp_path.iterdir()) == []


# -- OOM --------------------------------------------------------------------------------


def test_an_oom_kill_is_read_from_memory_events_with_the_limit(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    groups = Cgroups(Layout("v2", tmp_path), "fleet", "n1")
    groups.create("job-1.1", Limits(memory=64 * MiB))
    events = tmp_path / "fleet" / "n1" / "job-1.1" / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\noom_group_kill 0\n")
    assert groups.oom_limit("job-1.1") is None  # the limit was reached, nothing was killed
    events.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert groups.oom_limit("job-1.1") == 64 * MiB


def test_an_oom_kill_is_read_from_v1_oom_control(tmp_path: Path) -> None:
    layout = Layout("hybrid", tmp_path / "unified", {"memory": tmp_path / "memory"})
    for mount in ("unified", "memory"):
        (tmp_path / mount).mkdir()
    groups = Cgroups(layout, "fleet", "n1")
    groups.create("job-1.1", Limits(memory=32 * MiB))
    control = tmp_path / "memory" / "fleet" / "n1" / "job-1.1" / "memory.oom_control"
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert groups.oom_limit("job-1.1") == 32 * MiB
    assert groups.oom_limit("job-2.1") is None  # no such cgroup


# -- kills --------------------------------------------------------------------------------


def test_a_kill_writes_cgroup_kill_where_there_is_one(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    (tmp_path / "cgroup.kill").write_text("")
    (tmp_path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    kill_cgroup(str(tmp_path / "cgroup.kill"), str(tmp_path / "cgroup.procs"))
    assert (tmp_path / "cgroup.kill").read_text() == "1"
    assert sleeper.poll() is None  # the kernel kills; the pids are not signalled one by one


def test_without_cgroup_kill_each_listed_pid_is_killed(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    (tmp_path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    kill_cgroup(None, str(tmp_path / "cgroup.procs"))
    assert sleeper.wait(timeout=10) == -9


def test_a_new_supervisor_kills_what_its_predecessor_left_in_attempt_cgroups(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    node = tmp_path / "fleet" / "n1"
    for key, procs in (("job-1.1", f"{sleeper.pid}\n"), ("job-2.1", "")):
        (node / key).mkdir(parents=True)
        (node / key / "cgroup.procs").write_text(procs)
    assert kill_leftovers([node, tmp_path / "absent"]) == 1
    assert sleeper.wait(timeout=10) == -9


# -- the host's own cgroups -------------------------------------------------------------------


def test_an_attempt_in_a_real_cgroup_is_limited_and_killed_whole() -> None:
    layout = detect()
    if layout.kind == "none":
        pytest.skip(f"no writable cgroups here: {layout.why}")
    groups = Cgroups(layout, f"fleet-unit-{uuid.uuid4().hex[:12]}", "n1")
    joined = groups.create("job-1.1", Limits(memory=64 * MiB, cpus=0.5, pids=20))
    try:
        # a leader, and a child in a session of its own, both in the attempt's cgroup
        leader = subprocess.Popen(
            ["sh", "-c", "setsid sleep 60 & exec sleep 60"],
            start_new_session=True,
            preexec_fn=lambda: supervisor._in_child(joined.procs, None, None),
        )
        deadline = time.monotonic() + 10
        while len(groups.members("job-1.1")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        members = groups.members("job-1.1")
        assert leader.pid in members and len(members) == 2
        pids = next(d for d in groups.dirs("job-1.1") if (d / "pids.max").exists())
        assert (pids / "pids.max").read_text().strip() == "20"

        groups.remove("job-1.1")

        assert leader.wait(timeout=10) == -9
        assert groups.members("job-1.1") == [] and not any(d.exists() for d in groups.dirs("job-1.1"))
    finally:
        groups.remove("job-1.1")
        for folder in groups.node_dirs():
            for path in (folder, folder.parent):
                path.rmdir()


def test_an_attempt_that_cannot_join_its_cgroup_is_not_started(tmp_path: Path) -> None:
    sup = supervisor.Supervisor(tmp_path, margin=0.1)
    sup.until = time.monotonic() + 60
    gone = tmp_path / "cgroup" / "job-1.1" / "cgroup.procs"
    reply = sup.spawn({"key": "job-1.1", "argv": ["true"], "env": {}, "cgroup_procs": [str(gone)]})
    assert reply == {"error": f"cannot put the attempt in its cgroup {[str(gone)]} or switch to its user"}
    assert sup.held == {} and not (tmp_path / "attempts" / "job-1.1" / "meta.json").exists()
    with pytest.raises(ValueError, match="bad cgroup file"):  # the supervisor writes only cgroup files
        sup.spawn({"key": "job-1.1", "argv": ["true"], "env": {}, "cgroup_procs": ["/etc/passwd"]})


def test_a_host_whose_kernel_refuses_the_node_directory_has_no_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory\n")  # no cgroup.subtree_control: refused
    monkeypatch.setattr(cgroups, "detect", lambda: Layout("v2", tmp_path))
    found = cgroups.open_cgroups("fleet", "n1")
    assert found.layout.kind == "none" and found.layout.why.startswith(f"cannot set up {tmp_path}")
    v2_tree(tmp_path)
    assert cgroups.open_cgroups("fleet", "n1").layout == Layout("v2", tmp_path)
