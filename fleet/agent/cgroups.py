"""Each process-runtime attempt in a cgroup of its own: limits, and a kill that reaches every process.

An attempt's cgroup is ``<cgroup_parent>/<node>/<job>.<attempt>`` in each hierarchy (the node in
the path: several agents may share a host). The agent makes it and writes its limits; the node
supervisor moves the attempt's first process into it before exec, so everything the job starts,
``setsid`` or not, is in it, and killing the cgroup kills the job, all of it. Layouts:

- ``v2``: cgroup2 at ``/sys/fs/cgroup``; ``+memory +cpu +pids`` enabled in ``cgroup.subtree_control``
  down the chain; ``memory.max``, ``memory.swap.max`` (0), ``cpu.max``, ``pids.max``.
- ``hybrid``: cgroup2 at ``/sys/fs/cgroup/unified`` holds no controller: membership and
  ``cgroup.kill``; the v1 ``memory``, ``cpu`` and ``pids`` hierarchies hold the limits
  (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``, ``cpu.cfs_quota_us``, ``pids.max``).
- ``v1``: v1 hierarchies only: limits as in hybrid; a kill signals every pid the pids cgroup lists.
- ``none``: nothing writable (an agent that is not root, a read-only ``/sys/fs/cgroup``): attempts
  are killed by process group (a ``setsid`` child escapes) and nothing is limited; ``fleet doctor``
  warns.

A kill writes 1 to ``cgroup.kill`` (Linux 5.14+), else SIGKILLs each pid in ``cgroup.procs`` until
a round finds no new one: :func:`fleet.agent.supervisor.kill_cgroup`, shared with the supervisor.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fleet.agent.supervisor import kill_cgroup
from fleet.errors import LaunchError
from fleet.log import event

log = logging.getLogger("fleet.agent.cgroups")

ROOT = Path("/sys/fs/cgroup")
MOUNTS = Path("/proc/self/mounts")
#: the controllers fleet limits attempts through
CONTROLLERS = ("memory", "cpu", "pids")
#: the CFS period a CPU limit is a quota of (microseconds), as Docker's
CPU_PERIOD_US = 100_000
MiB = 1 << 20

Kind = Literal["v2", "hybrid", "v1", "none"]


@dataclass(frozen=True)
class Layout:
    kind: Kind
    #: the cgroup2 mount (v2, hybrid): membership and ``cgroup.kill``
    unified: Path | None = None
    #: v1 hierarchies by controller (hybrid, v1): the limits
    v1: dict[str, Path] = field(default_factory=dict)
    #: why there are no cgroups (none)
    why: str = ""

    def describe(self) -> str:
        if self.kind == "v2":
            return f"cgroup v2 at {self.unified}"
        if self.kind == "hybrid":
            return f"hybrid: cgroup v2 at {self.unified}, v1 {', '.join(sorted(self.v1))}"
        if self.kind == "v1":
            return f"cgroup v1 ({', '.join(sorted(self.v1))}), no cgroup2"
        return f"no cgroups: {self.why}"


def detect(root: Path = ROOT, mounts: Path = MOUNTS, euid: int | None = None) -> Layout:
    """Which cgroups this host has and this process may use, from ``mounts`` (``/proc/self/mounts``)."""
    try:
        unified, v1 = _mounted(root, mounts.read_text())
    except OSError as exc:
        return Layout("none", why=f"cannot read {mounts}: {exc.strerror}")
    if unified == root:
        kind: Kind = "v2"
        v1 = {}
    elif v1:
        kind = "hybrid" if unified is not None else "v1"
    else:
        return Layout("none", why=f"no cgroup filesystem mounted at {root}")
    if (os.geteuid() if euid is None else euid) != 0:
        return Layout("none", why="the agent is not root")
    for path in [*([unified] if unified else []), *v1.values()]:
        if not os.access(path, os.W_OK):
            return Layout("none", why=f"{path} is not writable (mounted read-only?)")
    return Layout(kind, unified, v1)


def _mounted(root: Path, mounts: str) -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount at or under ``root`` (``root`` itself first) and v1 hierarchies by controller."""
    unified: Path | None = None
    v1: dict[str, Path] = {}
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        where, fstype, options = Path(_unescape(parts[1])), parts[2], parts[3].split(",")
        if fstype == "cgroup2" and where in (root, root / "unified") and unified != root:
            unified = where
        elif fstype == "cgroup" and where.parent == root:
            for controller in set(CONTROLLERS) & set(options):
                v1.setdefault(controller, where)
    return unified, v1


def _unescape(path: str) -> str:
    """A mount point as ``/proc/self/mounts`` writes it (space, tab, newline, backslash in octal)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


@dataclass(frozen=True)
class Limits:
    memory: int | None = None
    cpus: float | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Joined:
    """What the supervisor needs to put an attempt in its cgroup and kill it there."""

    #: the ``cgroup.procs`` files the attempt's first process joins (the membership one first)
    procs: list[str]
    #: the ``cgroup.kill`` file, where the kernel has it
    kill: str | None


class Cgroups:
    """The attempt cgroups of one node, in ``layout``, under ``parent`` (``agent.cgroup_parent``)."""

    def __init__(self, layout: Layout, parent: str, node: str) -> None:
        self.layout, self.parent, self.node = layout, parent, node

    @property
    def enabled(self) -> bool:
        return self.layout.kind != "none"

    def _hierarchies(self) -> list[tuple[Path, tuple[str, ...]]]:
        """(mount, controllers limited there): the membership hierarchy first."""
        layout = self.layout
        if layout.kind == "v2" and layout.unified is not None:
            return [(layout.unified, CONTROLLERS)]
        found: list[tuple[Path, tuple[str, ...]]] = [(layout.unified, ())] if layout.unified else []
        by_mount: dict[Path, tuple[str, ...]] = {}
        for controller, mount in sorted(layout.v1.items(), key=lambda c: c[0] != "pids"):
            by_mount[mount] = (*by_mount.get(mount, ()), controller)
        return found + list(by_mount.items())

    def node_dirs(self) -> list[Path]:
        """This node's directory in each hierarchy (the membership one first): the supervisor kills
        what a dead predecessor left in the attempt cgroups under them."""
        return [mount / self.parent / self.node for mount, _ in self._hierarchies()]

    def dirs(self, key: str) -> list[Path]:
        return [folder / key for folder in self.node_dirs()]

    def create(self, key: str, limits: Limits) -> Joined:
        """Make the attempt's cgroups and write its limits. LaunchError (retryable) when it cannot."""
        if not self.enabled:
            return Joined([], None)
        try:
            for mount, controllers in self._hierarchies():
                self._create(mount, controllers, key, limits)
        except OSError as exc:
            raise LaunchError(
                f"cannot set up the attempt's cgroup ({exc.filename or key}): {exc.strerror}", retryable=True
            ) from exc
        leaf = self.dirs(key)
        kill = leaf[0] / "cgroup.kill"
        return Joined([str(d / "cgroup.procs") for d in leaf], str(kill) if kill.exists() else None)

    def prepare(self) -> None:
        """Make this node's directory in each hierarchy (OSError when the kernel refuses)."""
        for mount, _ in self._hierarchies():
            self._node_dir(mount)

    def _node_dir(self, mount: Path) -> Path:
        v2 = self.layout.kind == "v2"
        folder = mount
        for part in [*self.parent.split("/"), self.node]:
            if v2:  # a cgroup's limits apply only where its parent enabled the controller
                _enable(folder)
            folder = folder / part
            folder.mkdir(exist_ok=True)
        if v2:
            _enable(folder)
        return folder

    def _create(self, mount: Path, controllers: tuple[str, ...], key: str, limits: Limits) -> None:
        v2 = self.layout.kind == "v2"
        leaf = self._node_dir(mount) / key
        leaf.mkdir(exist_ok=True)
        for name, value in _settings(v2, controllers, limits):
            optional = name.startswith("memory.memsw") or name == "memory.swap.max"
            if optional and not (leaf / name).exists():  # a kernel without swap accounting
                continue
            (leaf / name).write_text(value)

    def members(self, key: str) -> list[int]:
        """Pids in the attempt's cgroup."""
        if not self.enabled:
            return []
        try:
            return [int(p) for p in (self.dirs(key)[0] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self, key: str) -> None:
        """SIGKILL every process in the attempt's cgroup."""
        if self.enabled:
            leaf = self.dirs(key)[0]
            kill = leaf / "cgroup.kill"
            kill_cgroup(str(kill) if kill.exists() else None, str(leaf / "cgroup.procs"))

    def remove(self, key: str, wait_s: float = 5.0) -> None:
        """Kill the attempt's processes, wait for them to exit, remove its cgroups."""
        if not self.enabled:
            return
        self.kill(key)
        deadline = time.monotonic() + wait_s
        while self.members(key) and time.monotonic() < deadline:
            time.sleep(0.02)
        for folder in self.dirs(key):
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                event(log, "cgroup_not_removed", logging.WARNING, cgroup=folder, error=exc.strerror)

    def oom_limit(self, key: str) -> int | None:
        """The memory limit (bytes) of an attempt the kernel OOM-killed a process of; None when no
        process of it was (or it had no limit, or no cgroup)."""
        if not self.enabled:
            return None
        if self.layout.kind == "v2":
            folder, events, count, limit = self.dirs(key)[0], "memory.events", "oom_kill", "memory.max"
        elif "memory" in self.layout.v1:
            folder = self.layout.v1["memory"] / self.parent / self.node / key
            events, count, limit = "memory.oom_control", "oom_kill", "memory.limit_in_bytes"
        else:
            return None
        try:
            stats = dict(line.split(None, 1) for line in (folder / events).read_text().splitlines())
            if int(stats.get(count, "0")) <= 0:
                return None
            value = (folder / limit).read_text().strip()
        except (OSError, ValueError):
            return None
        return int(value) if value.isdigit() else None


def _enable(folder: Path) -> None:
    """Enable fleet's controllers for ``folder``'s children (those the kernel offers there)."""
    offered = set((folder / "cgroup.controllers").read_text().split())
    enabled = set((folder / "cgroup.subtree_control").read_text().split())
    wanted = [f"+{c}" for c in CONTROLLERS if c in offered and c not in enabled]
    if wanted:
        (folder / "cgroup.subtree_control").write_text(" ".join(wanted))


def _settings(v2: bool, controllers: tuple[str, ...], limits: Limits) -> list[tuple[str, str]]:
    """The (file, value) pairs that set ``limits`` in a cgroup with ``controllers``, in order."""
    found = []
    if "memory" in controllers and limits.memory is not None:
        if v2:
            found += [("memory.max", str(limits.memory)), ("memory.swap.max", "0")]
        else:  # memsw (memory + swap) may not be set below memory
            found += [
                ("memory.limit_in_bytes", str(limits.memory)),
                ("memory.memsw.limit_in_bytes", str(limits.memory)),
            ]
    if "cpu" in controllers and limits.cpus is not None:
        quota = max(int(limits.cpus * CPU_PERIOD_US), 1000)
        if v2:
            found.append(("cpu.max", f"{quota} {CPU_PERIOD_US}"))
        else:
            found += [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))]
    if "pids" in controllers and limits.pids is not None:
        found.append(("pids.max", str(limits.pids)))
    return found


def open_cgroups(parent: str, node: str) -> Cgroups:
    """This node's attempt cgroups, in the layout this host has: none where the kernel refuses to
    make this node's directories (a container that mounts cgroupfs read-write but owns no cgroup)."""
    cgroups = Cgroups(detect(), parent, node)
    try:
        cgroups.prepare()
    except OSError as exc:
        why = f"cannot set up {exc.filename or cgroups.node_dirs()[0]}: {exc.strerror}"
        return Cgroups(Layout("none", why=why), parent, node)
    return cgroups


def log_layout(cgroups: Cgroups) -> None:
    """Say once (at the agent's start) how process-runtime attempts are contained."""
    layout = cgroups.layout
    if layout.kind == "none":
        event(
            log,
            "cgroups_unavailable",
            logging.WARNING,
            why=layout.why,
            effect="attempts are killed by process group, and not limited",
        )
    else:
        event(log, "cgroups", layout=layout.describe(), parent=f"{cgroups.parent}/{cgroups.node}")
