"""``fleet shell``, on the agent of the job's node: a command inside a running attempt's environment,
as its user.

Docker runtime: ``docker exec`` into the attempt's container, whose user, working directory and
environment are the job's. Process runtime: the command joins the attempt's cgroups (so it is
limited, counted and killed with the job), takes the attempt leader's uid and gid (no supplementary
groups, as the job), working directory and environment, then execs. The agent starts
``python -m fleet.agent.enter`` (``main``) with the :class:`Entry` in its environment: that process
drops the agent's privileges for the job's before it execs the command, so the command never holds
more than the job does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import termios
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

from fleet.agent.cgroups import Cgroups, detect
from fleet.agent.runtime import recorded_runtime
from fleet.agent.runtime.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_NODE
from fleet.agent.runtime.process import leader_state
from fleet.config_sections import AgentSettings
from fleet.errors import FleetError

#: a container's shell when no command is given: bash where the image has it
_CONTAINER_SHELL = ["sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash || exec sh"]


@dataclass(frozen=True)
class Entry:
    """What to exec, and as whom, where and in which cgroups (a process attempt's)."""

    argv: list[str]
    env: dict[str, str] | None = None
    cwd: str | None = None
    uid: int | None = None
    gid: int | None = None
    #: the attempt's ``cgroup.procs`` files, joined before the switch of user
    procs: list[str] = field(default_factory=list)
    #: ``FLEET_SHELL_SESSION=<session>`` in the environment of a ``docker exec``'d command: what finds
    #: its processes in the container once the session ends (:func:`stop_marked`); "" otherwise
    marker: str = ""


#: the variable that carries the :class:`Entry` to ``main``
ENTRY_VAR = "FLEET_SHELL_ENTRY"
#: the variable that marks a ``docker exec``'d shell's processes with its session
SESSION_VAR = "FLEET_SHELL_SESSION"


def entry(
    settings: AgentSettings,
    job_id: str,
    attempt: int,
    command: list[str],
    tty: bool,
    term: str = "",
    session: str = "",
) -> Entry:
    """How to run ``command`` (none: a shell) in attempt ``attempt`` of ``job_id`` on this node;
    ``term``: the caller's TERM (none: the job's own); ``session``: the shell's id (it marks the
    processes a ``docker exec`` starts)."""
    runtime = recorded_runtime(settings.state_dir)
    if runtime == "docker":
        return _docker(settings.node_name, job_id, attempt, command, tty, term, session)
    if runtime == "process":
        return _process(settings, job_id, attempt, command, term)
    raise FleetError(f"no attempt has run with state_dir {settings.state_dir} on node {settings.node_name}")


def _docker(
    node: str, job_id: str, attempt: int, command: list[str], tty: bool, term: str, session: str
) -> Entry:
    import docker
    from docker.errors import DockerException

    labels = [f"{LABEL_NODE}={node}", f"{LABEL_JOB}={job_id}", f"{LABEL_ATTEMPT}={attempt}"]
    try:
        found = docker.from_env(timeout=30).containers.list(filters={"label": labels}, ignore_removed=True)
    except DockerException as exc:
        raise FleetError(f"Docker daemon not reachable: {exc}") from None
    if not found:
        raise FleetError(f"job {job_id}: no running container of attempt {attempt} on node {node}")
    if shutil.which("docker") is None:
        raise FleetError(
            f"the docker command is not installed on node {node} (fleet shell runs `docker exec` there)"
        )
    marker = f"{SESSION_VAR}={session}" if session else ""
    env = [*(["-e", f"TERM={term}"] if term else []), *(["-e", marker] if marker else [])]
    return Entry(
        ["docker", "exec", "-it" if tty else "-i", *env, found[0].id, *(command or _CONTAINER_SHELL)],
        marker=marker,
    )


def stop_marked(marker: str, grace_s: float = 2.0) -> int:
    """End the processes whose environment holds ``marker`` (a ``docker exec``'d command and what it
    started: Docker has no call that stops an exec, and one outlives the ``docker exec`` that
    started it): SIGHUP, as a closed terminal sends, then SIGKILL to those still there after
    ``grace_s``. Found through this host's ``/proc`` (an agent that sees the containers' processes,
    as one on the host does, as root); how many there were."""
    mark = marker.encode()
    found = _marked(mark)
    _signal(found, signal.SIGHUP)
    left, deadline = found, time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if _holds(pid, mark)]
    _signal(left, signal.SIGKILL)
    return len(found)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            os.kill(pid, sig)


def _marked(marker: bytes) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _holds(int(name), marker):
            pids.append(int(name))
    return pids


def _holds(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return marker in file.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _process(settings: AgentSettings, job_id: str, attempt: int, command: list[str], term: str) -> Entry:
    key = f"{job_id}.{attempt}"
    try:
        meta = json.loads((settings.state_dir / "attempts" / key / "meta.json").read_text())
    except (OSError, ValueError):
        raise FleetError(f"job {job_id}: attempt {attempt} is not on node {settings.node_name}") from None
    pid = int(meta["pid"])
    if leader_state(pid, meta["created"], meta.get("supervisor")) != "running":
        raise FleetError(f"job {job_id}: attempt {attempt} has ended on this node")
    proc = Path(f"/proc/{pid}")
    try:
        ids = {
            k: v.split()
            for k, _, v in (line.partition(":") for line in (proc / "status").read_text().splitlines())
        }
        env = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
        cwd = os.readlink(proc / "cwd")
    except OSError as exc:
        raise FleetError(f"job {job_id}: cannot read its process {pid} ({exc.strerror})") from None
    if term:
        env["TERM"] = term
    cgroups = Cgroups(detect(), settings.cgroup_parent, settings.node_name)
    procs = [str(d / "cgroup.procs") for d in cgroups.dirs(key)] if cgroups.enabled else []
    argv = command or ["/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"]
    return Entry(
        argv, env, cwd, int(ids["Uid"][0]), int(ids["Gid"][0]), [p for p in procs if os.path.exists(p)]
    )


def enter(e: Entry) -> NoReturn:
    """Become the attempt's (cgroups, user, directory) and exec its command in place of this process."""
    if e.uid is not None and os.geteuid() not in (0, e.uid):
        raise FleetError(f"the job runs as uid {e.uid}: the agent (uid {os.geteuid()}) cannot take it")
    _join(e.procs)
    if e.uid is not None and os.geteuid() != e.uid:
        os.setgroups([])
        if e.gid is not None:
            os.setgid(e.gid)
        os.setuid(e.uid)
    if e.cwd is not None:
        try:
            os.chdir(e.cwd)
        except OSError as exc:
            raise FleetError(f"cannot enter the job's directory {e.cwd} ({exc.strerror})") from None
    # Python ignores SIGPIPE and SIGXFSZ, an agent started by nohup (or in a script's background)
    # SIGHUP or SIGINT, and an exec keeps what is ignored: the command gets them as a login shell's
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        if e.env is None:
            os.execvp(e.argv[0], e.argv)
        os.execvpe(e.argv[0], e.argv, e.env)
    except OSError as exc:
        raise FleetError(f"{e.argv[0]}: cannot run it in the job ({exc.strerror})") from None


def _join(procs: list[str]) -> None:
    """Move this process into the attempt's cgroups (its ``cgroup.procs`` files)."""
    for path in procs:
        try:
            with open(path, "w") as f:
                f.write("0")
        except OSError as exc:
            raise FleetError(f"cannot join the job's cgroup {path} ({exc.strerror})") from None


def carried(e: Entry) -> dict[str, str]:
    """The environment of the ``main`` that enters ``e``: the agent's own, and the entry."""
    return {**os.environ, ENTRY_VAR: json.dumps(asdict(e))}


def main() -> NoReturn:
    """``python -m fleet.agent.enter``, started by the agent with :func:`carried`'s environment and
    the session's terminal (or pipes) as stdin, stdout and stderr: take the terminal as the
    controlling one, then :func:`enter`. Exits 127 where the command cannot be run."""
    e = Entry(**json.loads(os.environ.pop(ENTRY_VAR)))
    if os.isatty(0):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    try:
        enter(e)
    except FleetError as exc:
        print(f"fleet: {exc}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main()
