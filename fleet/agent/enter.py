"""``fleet shell`` on a node: a command inside a running attempt's environment, as its user.

Docker runtime: ``docker exec`` into the attempt's container, whose user, working directory and
environment are the job's. Process runtime: the command joins the attempt's cgroups (so it is
limited, counted and killed with the job), takes the attempt leader's uid and gid (no supplementary
groups, as the job), working directory and environment, then execs. Both need what the agent has:
root on the node (or, on the process runtime, the uid the jobs run as when the agent runs them as
its own user).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass, field
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


def entry(settings: AgentSettings, job_id: str, attempt: int, command: list[str], tty: bool) -> Entry:
    """How to run ``command`` (none: a shell) in attempt ``attempt`` of ``job_id`` on this node."""
    runtime = recorded_runtime(settings.state_dir)
    if runtime == "docker":
        return _docker(settings.node_name, job_id, attempt, command, tty)
    if runtime == "process":
        return _process(settings, job_id, attempt, command)
    raise FleetError(
        f"no agent has run jobs with state_dir {settings.state_dir} on this node: give fleet shell the "
        "agent's configuration (--config FILE or FLEET_CONFIG, e.g. /etc/fleet/fleet.toml)"
    )


def _docker(node: str, job_id: str, attempt: int, command: list[str], tty: bool) -> Entry:
    import docker
    from docker.errors import DockerException

    labels = [f"{LABEL_NODE}={node}", f"{LABEL_JOB}={job_id}", f"{LABEL_ATTEMPT}={attempt}"]
    try:
        found = docker.from_env(timeout=30).containers.list(filters={"label": labels})
    except DockerException as exc:
        raise FleetError(
            f"Docker daemon not reachable: {exc} (run fleet shell as the agent's user)"
        ) from None
    if not found:
        raise FleetError(f"job {job_id}: no running container of attempt {attempt} on node {node}")
    if shutil.which("docker") is None:
        raise FleetError("the docker command is not installed on this node (fleet shell execs `docker exec`)")
    return Entry(["docker", "exec", "-it" if tty else "-i", found[0].id, *(command or _CONTAINER_SHELL)])


def _process(settings: AgentSettings, job_id: str, attempt: int, command: list[str]) -> Entry:
    key = f"{job_id}.{attempt}"
    try:
        meta = json.loads((settings.state_dir / "attempts" / key / "meta.json").read_text())
    except (OSError, ValueError):
        raise FleetError(
            f"job {job_id}: attempt {attempt} is not in {settings.state_dir}/attempts on this node "
            "(run fleet shell as root, with the agent's configuration)"
        ) from None
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
        raise FleetError(
            f"job {job_id}: cannot read its process {pid} ({exc.strerror}): run fleet shell as root"
        ) from None
    if "TERM" in os.environ:
        env["TERM"] = os.environ["TERM"]
    cgroups = Cgroups(detect(), settings.cgroup_parent, settings.node_name)
    procs = [str(d / "cgroup.procs") for d in cgroups.dirs(key)] if cgroups.enabled else []
    argv = command or ["/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"]
    return Entry(
        argv, env, cwd, int(ids["Uid"][0]), int(ids["Gid"][0]), [p for p in procs if os.path.exists(p)]
    )


def enter(e: Entry) -> NoReturn:
    """Become the attempt's (cgroups, user, directory) and exec its command in place of this process."""
    if e.uid is not None and os.geteuid() not in (0, e.uid):
        raise FleetError(f"the job runs as uid {e.uid}: run fleet shell as root on this node (sudo)")
    for path in e.procs:
        try:
            with open(path, "w") as f:
                f.write("0")
        except OSError as exc:
            raise FleetError(
                f"cannot join the job's cgroup {path} ({exc.strerror}): run fleet shell as root"
            ) from None
    if e.uid is not None and os.geteuid() != e.uid:
        os.setgroups([])
        if e.gid is not None:
            os.setgid(e.gid)
        os.setuid(e.uid)
    if e.cwd is not None:
        os.chdir(e.cwd)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them, and an exec keeps that
        signal.signal(sig, signal.SIG_DFL)
    try:
        if e.env is None:
            os.execvp(e.argv[0], e.argv)
        os.execvpe(e.argv[0], e.argv, e.env)
    except OSError as exc:
        raise FleetError(f"{e.argv[0]}: cannot run it in the job ({exc.strerror})") from None
