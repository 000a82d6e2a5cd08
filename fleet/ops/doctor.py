"""``fleet doctor``: is this node ready to run fleet's agent? Each check is one :class:`Check`.

The checks read the settings the agent reads (``fleet.toml``, ``FLEET_*``; with no Redis user or
password given there, the ones ``fleet install agent`` handed the agent's unit) and use the agent's
own parts: the NVML inventory, the runtime choice, the Redis connection. Each says what it found
and, when it warns or fails, what to do. Nothing here changes what the agent runs; the doctor
writes only its marker (``<checkpoint_root>/.fleet-doctor/<node>`` and ``<prefix>:doctor:markers``),
by which nodes that share ``checkpoint_root`` recognise each other.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis

from fleet.agent import cgroups
from fleet.agent.gpus import busy_reason
from fleet.config import DAY, AgentSettings, Settings
from fleet.errors import ConfigError, GpuError
from fleet.keys import Keys

if TYPE_CHECKING:  # NVML and Docker are imported by the checks that use them
    from fleet.agent.gpus.nvml import NvmlGpus

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
#: Redis' clock and this node's further apart than this: a warning (see :func:`clock_check`)
SKEW_WARN_S = 0.5
#: markers older than this are forgotten (a node since removed, a storage since remounted)
MARKER_TTL_S = 7 * DAY
MARKER_DIR = ".fleet-doctor"
_MARKER_MAX = 4096
#: a node name, as the agent's settings allow it: a marker's name becomes a file name
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        status = self.status.upper() if self.status in (WARN, FAIL) else self.status
        fix = f"; fix: {self.fix}" if self.fix and self.status in (WARN, FAIL) else ""
        return f"{status:<4}  {self.name:<15}  {self.detail}{fix}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed, else 0 (warnings do not fail)."""
    return 1 if any(c.status == FAIL for c in checks) else 0


# -- GPUs ------------------------------------------------------------------------------


def gpu_checks(cfg: AgentSettings) -> tuple[list[Check], int]:
    """NVML, the driver, and a line per GPU; with the number of real GPUs that answered."""
    from fleet.agent.gpus import nvml

    simulated = f"{cfg.simulated_gpus} simulated GPUs"
    if cfg.gpus == "simulated":
        return [Check("nvml", SKIP, f"not used: agent.gpus = simulated, the agent offers {simulated}")], 0
    try:
        gpus = nvml.NvmlGpus()
    except GpuError as exc:
        if cfg.gpus == "auto" and exc.code == nvml.LIBRARY_NOT_FOUND:
            return [Check(
                "nvml", WARN, f"no NVML library (libnvidia-ml.so): the agent will offer {simulated}",
                nvml.fix(exc.code),
            )], 0  # fmt: skip
        then = f"the agent would offer {simulated} instead" if cfg.gpus == "auto" else "the agent won't start"
        return [Check("nvml", FAIL, f"{exc}: {then}", nvml.fix(exc.code))], 0
    try:
        return _each_gpu(cfg, gpus, simulated, nvml.fix)
    finally:
        gpus.close()


def _each_gpu(cfg: AgentSettings, gpus: NvmlGpus, simulated: str, fix: Callable[[int | None], str]
              ) -> tuple[list[Check], int]:  # fmt: skip
    about = ", ".join(f"{name} {version}" for name, version in gpus.versions().items()) or "versions unknown"
    try:
        count = gpus.count()
    except GpuError as exc:
        return [Check("nvml", FAIL, f"{about}: {exc}", fix(exc.code))], 0
    if not count:
        then = f"the agent will offer {simulated}" if cfg.gpus == "auto" else "this node offers no GPU"
        return [Check(
            "nvml", WARN, f"{about}; NVML finds no GPU: {then}",
            "see nvidia-smi; on a node without GPUs set agent.gpus = 'simulated'",
        )], 0  # fmt: skip
    checks, answered = [Check("nvml", OK, f"{about}; {count} GPU{'s' * (count > 1)}")], 0
    for index in range(count):
        gpu, code = gpus.probe(index)
        name = f"gpu {index}"
        if code is not None or not gpu.healthy:
            checks.append(Check(name, FAIL, f"{gpu.uuid}: {gpu.health}", fix(code)))
            continue
        answered += 1
        found = f"{gpu.model}, {gpu.memory_total / (1 << 30):.0f} GiB, {gpu.uuid}"
        if why := busy_reason(gpu, (), cfg.gpu_busy_memory):
            checks.append(Check(
                name, WARN, f"{found}: {why}",
                "fleet places no job on a busy GPU: end that process (an agent running here shows its "
                "own jobs' processes too)",
            ))  # fmt: skip
        else:
            checks.append(Check(name, OK, found))
    return checks, answered


# -- runtime, Docker, cgroups ---------------------------------------------------------


def runtime_checks(
    cfg: AgentSettings, gpus: int, image: str, client: Any = None
) -> tuple[list[Check], str | None]:
    """Which runtime the agent opens and, for Docker, that the daemon answers, its NVIDIA runtime
    and a ``--gpus`` container when there are GPUs; with the runtime's name (None: none opens)."""
    from fleet.agent.runtime import RECORD, choose, docker_installed, recorded_runtime

    recorded = recorded_runtime(cfg.state_dir)
    try:
        name = choose(cfg.runtime, recorded, docker_installed())
    except ConfigError as exc:
        return [Check("runtime", FAIL, str(exc), f"stop this node's jobs, delete state_dir/{RECORD}")], None
    why = f"agent.runtime = {cfg.runtime}" + (f", recorded in state_dir/{RECORD}" if recorded else "")
    if name == "process":
        checks = [Check("runtime", OK, f"process ({why}): jobs run as plain processes, each in a cgroup")]
        return [*checks, Check("docker", SKIP, "not used by the process runtime")], name
    import docker
    from docker.errors import DockerException

    try:
        client = client or docker.from_env(timeout=30)
        client.ping()
        version, info = client.version(), client.info()
    except DockerException as exc:
        return [Check(
            "docker", FAIL, f"Docker daemon not reachable ({why}): {exc}",
            "start dockerd (systemctl start docker), or set agent.runtime = 'process' on a node "
            "without Docker",
        )], None  # fmt: skip
    runtimes = sorted(info.get("Runtimes") or {})
    checks = [Check("runtime", OK, f"docker ({why})"), Check(
        "docker", OK, f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')}), "
        f"cgroup v{info.get('CgroupVersion', '?')}, runtimes {', '.join(runtimes) or 'none'}",
    )]  # fmt: skip
    if not gpus:
        return [*checks, Check("docker --gpus", SKIP, "no GPU here: no --gpus container to try")], name
    toolkit = ("install the NVIDIA Container Toolkit, run nvidia-ctk runtime configure --runtime=docker "
               "and restart dockerd")  # fmt: skip
    if "nvidia" not in runtimes:
        checks.append(Check("nvidia runtime", WARN, "Docker has no nvidia runtime registered", toolkit))
    else:
        checks.append(Check("nvidia runtime", OK, "registered with Docker"))
    return [*checks, gpu_container_check(client, image, gpus, cfg.docker_pull, toolkit)], name


def network_guard_check(cfg: AgentSettings, runtime: str | None, client: Any = None) -> Check:
    """Whether the rules and the network that keep Docker jobs off this node's services are there
    (the agent installs them when it starts; this only looks)."""
    from fleet.agent import netguard

    name, blocked = "network guard", ", ".join(cfg.job_blocked_networks) or "no network"
    if runtime != "docker":
        return Check(name, SKIP, "not used by the process runtime (its jobs share the node's network)")
    if not cfg.job_network_guard:
        return Check(name, WARN, "off (agent.job_network_guard = false): Docker jobs reach this node's "
                     f"services, each other and {blocked}", "set agent.job_network_guard = true")  # fmt: skip
    if os.geteuid() != 0:
        return Check(name, WARN, "cannot read the firewall: not root", "run fleet doctor as root")
    found = netguard.families()
    if 4 not in found:
        return Check(name, WARN, f"iptables not found: Docker jobs reach this node's services and {blocked}",
                     "install iptables and restart the agent")  # fmt: skip
    try:
        uids = netguard.guarded_uids(cfg)
    except ConfigError as exc:
        return Check(name, FAIL, str(exc), "fix agent.job_uid_range")
    missing = [m for f in found for m in netguard.installed(
        netguard.plan(f, uids, cfg.job_blocked_networks, netguard.forward_chain(f)))]  # fmt: skip
    import docker
    from docker.errors import DockerException

    try:
        client = client or docker.from_env(timeout=30)
        if not client.networks.list(names=[netguard.NETWORK]):
            missing.append(f"Docker network {netguard.NETWORK}")
    except DockerException as exc:
        missing.append(f"Docker network {netguard.NETWORK} ({exc})")
    if missing:
        return Check(name, WARN, f"not in place: {', '.join(missing)}", "start (or restart) the agent as "
                     "root: it installs them when it starts and checks them again at launches")  # fmt: skip
    families = " and ".join(netguard.TOOLS[f] for f in found)
    network = f"{netguard.NETWORK} (bridge {netguard.BRIDGE})"
    return Check(name, OK, f"jobs on {network} reach neither this node nor each other; uids {uids} "
                 f"kept off loopback; {blocked} blocked ({families})")  # fmt: skip


def gpu_container_check(client: Any, image: str, gpus: int, pull: str, toolkit: str) -> Check:
    """``docker run --gpus all IMAGE nvidia-smi -L``, as the agent asks for GPUs: it lists them all."""
    from docker.errors import DockerException, ImageNotFound
    from docker.types import DeviceRequest

    name = "docker --gpus"
    try:
        try:
            client.images.get(image)
        except ImageNotFound:
            if pull == "never":
                return Check(name, WARN, f"{image} is not here and agent.docker_pull = never",
                             f"docker pull {image} (or set default_image)")  # fmt: skip
            client.images.pull(image)
        container = client.containers.run(
            image, ["nvidia-smi", "-L"], detach=True, labels={"fleet.ops.doctor": "gpus"},
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])],
            environment={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
        )  # fmt: skip
        try:
            code = int(container.wait(timeout=120).get("StatusCode", -1))
            output = container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    except DockerException as exc:
        return Check(name, FAIL, f"a container with --gpus all ({image}) did not run: {exc}", toolkit)
    listed = [line for line in output.splitlines() if line.startswith("GPU ")]
    if code != 0:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return Check(name, FAIL, f"nvidia-smi -L in {image} exited {code}: {tail[0]}", toolkit)
    if len(listed) < gpus:
        return Check(name, WARN, f"a container sees {len(listed)} of the {gpus} GPUs NVML finds",
                     "check NVIDIA_VISIBLE_DEVICES in /etc/nvidia-container-runtime/config.toml")  # fmt: skip
    return Check(name, OK, f"a container with --gpus all sees {len(listed)} GPUs ({image})")


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
            "cgroups", WARN, f"cgroup v1 ({root}/cgroup.controllers is missing): Docker limits jobs with "
            "v1 controllers, which Docker and systemd are dropping",
            "boot with systemd.unified_cgroup_hierarchy=1 (the default of current distributions)",
        )  # fmt: skip
    except OSError as exc:
        return Check("cgroups", WARN, f"cannot read {root}/cgroup.controllers: {exc.strerror}")
    limits = {"memory": "memory", "cpu": "cpus", "pids": "pids_limit"}
    missing = [f"{c} ({what})" for c, what in limits.items() if c not in found]
    if missing:
        return Check(
            "cgroups", WARN, f"cgroup v2 without {', '.join(missing)}: those limits are not enforced",
            "enable the controllers (a kernel booted with cgroup_disable=...? see /proc/cmdline)",
        )  # fmt: skip
    return Check("cgroups", OK, f"cgroup v2: {' '.join(sorted(found))}")


def process_cgroup_check(layout: cgroups.Layout) -> Check:
    """Whether the process runtime can put each attempt in a cgroup: limits, and a kill that reaches
    every process of a job (without, a child in a session of its own outlives its job)."""
    if layout.kind == "none":
        return Check(
            "cgroups", WARN, f"{layout.describe()}: process-runtime jobs are not limited (memory, CPUs, "
            "processes) and are killed by process group, which a child in a session of its own escapes",
            "run the agent as root on a host with /sys/fs/cgroup mounted read-write (cgroup v2 or hybrid)",
        )  # fmt: skip
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
            "cgroups", WARN,
            f"{layout.describe()}, without {', '.join(missing)}: those limits are not enforced",
            "enable the controllers (a kernel booted with cgroup_disable=...? see /proc/cmdline)",
        )  # fmt: skip
    if layout.kind == "v1":
        return Check(
            "cgroups", WARN,
            f"{layout.describe()}: limits hold, but a job is killed pid by pid (no cgroup.kill)",
            "mount cgroup2 (boot with systemd.unified_cgroup_hierarchy=1)",
        )  # fmt: skip
    return Check("cgroups", OK, f"{layout.describe()}: each attempt in a cgroup; memory, cpu, pids limited")


# -- Redis, and its clock ---------------------------------------------------------------


def redis_check(settings: Settings, source: str = "") -> tuple[Check, redis.Redis | None]:
    """Redis answers this node's ACL user; its version. With the client, None when it failed."""
    from fleet.state.connection import connect

    where = settings.redis_display
    user = settings.redis_username or urlsplit(settings.redis_url).username or "default"
    as_user = f"{user}{source}"
    password = ("the password must be the one users.acl holds for the user: give the agent its file "
                "with fleet install agent --redis-password-file FILE (or FLEET_REDIS_USERNAME and "
                "FLEET_REDIS_PASSWORD_FILE)")  # fmt: skip
    try:
        client = connect(settings)
        hello = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except ConfigError as exc:
        return Check("redis", FAIL, str(exc), password), None
    except redis.AuthenticationError as exc:
        return Check("redis", FAIL, f"{where} refused user {as_user}: {exc}", password), None
    except redis.exceptions.NoPermissionError as exc:
        return Check("redis", FAIL, f"{where}: user {as_user} may not connect: {exc}",
                     "give the user config/users.acl's fleet-agent line (ACL LOAD)"), None  # fmt: skip
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return Check("redis", FAIL, f"cannot reach Redis at {where}: {exc}",
                     "start Redis (7.0 or newer); check redis_url and that this node may reach its port"
                     ), None  # fmt: skip
    except redis.RedisError as exc:
        return Check("redis", FAIL, f"{where} as {as_user}: {exc}", "fleet needs Redis 7.0 or newer"), None
    info = hello if isinstance(hello, dict) else dict(zip(hello[::2], hello[1::2], strict=True))
    version = str(info.get("version", "?"))
    found = f"Redis {version} at {where}, as user {as_user}"
    if not version[:1].isdigit() or int(version.split(".")[0]) < 7:
        return Check("redis", WARN, found, "fleet needs Redis 7.0 or newer"), client
    return Check("redis", OK, found), client


def redis_clock(client: redis.Redis, probe_key: str) -> float:
    """Redis' clock, unix seconds: ``TIME``, or where the agent's ACL user may not run it, from when
    Redis expires a key it was told to keep 60 s (``PEXPIRETIME``, Redis 7.0)."""
    try:
        seconds, micros = client.time()
        return seconds + micros / 1e6
    except redis.exceptions.NoPermissionError:
        pipe = client.pipeline(transaction=True)
        pipe.set(probe_key, "1", px=60_000)
        pipe.execute_command("PEXPIRETIME", probe_key)  # type: ignore[no-untyped-call]
        pipe.delete(probe_key)
        _, expires_ms, _ = pipe.execute()
        return (int(expires_ms) - 60_000) / 1000


def clock_check(before: float, redis_now: float, after: float, fence_margin_s: float) -> Check:
    """This node's clock against Redis' (read between ``before`` and ``after`` on this node's).

    fleet's leases are Redis TTLs and the agent fences its jobs on its monotonic clock, so skew does
    not break fencing. But the times an agent writes (heartbeats, job starts, the STARTING deadline)
    are read against the controller's clock (a job's ``started_at`` says when it may be preempted):
    a skew above ``agent.fence_margin_s`` (2 s), the finest timing fleet keeps, makes those wrong by
    more than fleet's own slack, so it fails; above 0.5 s it warns. Only the part of the skew the
    round trip cannot explain counts."""
    skew = (before + after) / 2 - redis_now
    slack = (after - before) / 2
    certain = max(0.0, abs(skew) - slack)
    way = "ahead of" if skew > 0 else "behind"
    found = f"this node's clock is {abs(skew):.3f} s {way} Redis' (±{slack:.3f} s)"
    ntp = ("sync the clocks: run NTP (chrony or systemd-timesyncd) here and on Redis' host; "
           "timedatectl says whether a clock is synchronised")  # fmt: skip
    if certain > fence_margin_s:
        return Check("clock", FAIL, f"{found}, over agent.fence_margin_s ({fence_margin_s:g} s)", ntp)
    if certain > SKEW_WARN_S:
        return Check("clock", WARN, f"{found}, over {SKEW_WARN_S:g} s", ntp)
    return Check("clock", OK, found)


# -- checkpoint_root, and whose storage it is ---------------------------------------------


def new_marker(node: str, root: Path, now: float) -> str:
    """What a node writes to its marker file and to Redis: its name, the time, a random nonce."""
    return json.dumps({"node": node, "at": now, "nonce": secrets.token_hex(16), "root": str(root)})


def job_identity(cfg: AgentSettings) -> tuple[tuple[int, int], str]:
    """Whom the checks stand for, and the setting that names it: the node's fixed ``job_user``, or
    the first uid of ``job_uid_range`` (every tenant's jobs run as one of its uids, gid the same)."""
    if cfg.fixed_user is not None:
        return cfg.fixed_user, "agent.job_user"
    start = cfg.uid_range[0]
    return (start, start), "agent.job_uid_range"


def checkpoint_check(
    root: Path, node: str, marker: str, job_user: tuple[int, int], setting: str = "agent.job_user",
    euid: int | None = None, mounts: Path = Path("/proc/self/mounts"),
) -> Check:  # fmt: skip
    """``checkpoint_root`` is there, takes this node's marker, lets root give a job's directory to
    the job's user (as the agent does: NFS' root_squash forbids it), and the job's user (``job_user``,
    from ``setting``) can reach it."""
    euid = os.geteuid() if euid is None else euid
    name = "checkpoint root"
    if not root.is_dir():
        return Check(name, FAIL, f"checkpoint_root {root} does not exist (or is not a directory)",
                     f"mount the shared storage (e.g. NFS) at {root} on every node, or set checkpoint_root"
                     )  # fmt: skip
    where = f"{root} on {mount_of(root, mounts)}"
    folder = root / MARKER_DIR
    try:
        folder.mkdir(mode=0o755, exist_ok=True)
        _write_marker(folder, node, marker)
    except OSError as exc:
        return Check(name, FAIL, f"{where}: cannot write {folder / node}: {exc.strerror}",
                     "make checkpoint_root writable by root (a read-only mount? on NFS: no_root_squash)"
                     )  # fmt: skip
    job_uid, job_gid = job_user
    done = [f"{where}: writable"]
    if euid == 0:
        probe = folder / f"{node}.chown-{secrets.token_hex(4)}"
        try:
            probe.mkdir(mode=0o700)
            os.chown(probe, job_uid, job_gid)
        except OSError as exc:
            return Check(name, FAIL, f"{where}: root cannot give a job's directory to its user "
                         f"({job_uid}:{job_gid}): {exc.strerror}",
                         "export the storage to the GPU nodes with no_root_squash: the agent (root) "
                         "makes each job a directory owned by the job's user")  # fmt: skip
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
        done.append(f"jobs' directories can be given to {job_uid}:{job_gid}")
    else:
        done.append("not root, so jobs run as this user (the agent runs as root)")
        job_uid, job_gid = euid, os.getegid()
    if blocked := unreachable(root, job_uid, job_gid):
        path, mode = blocked
        return Check(name, FAIL, f"{where}: uid {job_uid} ({setting}) cannot enter {path} "
                     f"(mode {mode:04o}): its jobs cannot reach their checkpoints",
                     f"chmod o+x {path}")  # fmt: skip
    return Check(name, OK, ", ".join(done))


def _write_marker(folder: Path, node: str, marker: str) -> None:
    temporary = folder / f"{node}.tmp-{secrets.token_hex(4)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(marker)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, folder / node)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def unreachable(root: Path, uid: int, gid: int) -> tuple[Path, int] | None:
    """The first directory from ``/`` down to ``root`` that ``uid``:``gid`` may not enter, with its
    mode; None when it reaches ``root`` (root may enter anything)."""
    if uid == 0:
        return None
    path = root.resolve()
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if st.st_uid == uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return directory, stat.S_IMODE(st.st_mode)
    return None


def mount_of(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str:
    """``fstype source`` of the mount holding ``path`` (``nfs4 server:/export``), or ``?``."""
    target, best = str(path.resolve()), ("", "?")
    with contextlib.suppress(OSError):
        for line in mounts.read_text().splitlines():
            source, point, fstype, *_ = [*line.split(" "), "", ""]
            point = point.replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, f"{fstype} {source}")
    return best[1]


def shared_check(client: redis.Redis, keys: Keys, root: Path, node: str, marker: str, now: float) -> Check:
    """Publish this node's marker, then look for each other node's in this ``checkpoint_root``: every
    node that left one must have left it here, with the same content. Each node reaches a job's
    directory through its own ``checkpoint_root``, so the paths may differ; the storage may not."""
    name = "shared storage"
    try:
        markers = publish_marker(client, keys, node, marker, now)
    except redis.exceptions.NoPermissionError as exc:
        return Check(name, FAIL, f"cannot write {keys.doctor('markers')}: {exc}",
                     f"the user's users.acl line must grant ~{keys.prefix}:* (key_prefix)")  # fmt: skip
    except redis.RedisError as exc:
        return Check(name, FAIL, f"cannot publish this node's marker in Redis: {exc}", "see the redis line")
    same, problems = [], []
    for other, text in sorted(markers.items()):
        theirs = f"its checkpoint_root: {_field(text, 'root')}"
        if (here := _read_capped(root / MARKER_DIR / other)) is None:
            problems.append(f"node {other}'s marker is not here ({theirs})")
        elif here != text:
            problems.append(f"node {other}'s marker here is not the one it last wrote ({theirs})")
        else:
            same.append(other)
    also = f" (same storage as {_nodes(same)})" if same else ""
    if problems:
        return Check(
            name, FAIL, f"{'; '.join(problems)}: checkpoint_root is not shared storage{also}",
            "mount the same shared storage (e.g. NFS) on every node as its checkpoint_root, then run "
            "fleet doctor again on each (over NFS a marker written in the last minute may not show yet)",
        )  # fmt: skip
    if not same:
        return Check(name, OK, "no other node has left a marker yet: run fleet doctor on each node; "
                     "each checks the nodes that ran it before")  # fmt: skip
    return Check(name, OK, f"same storage as {_nodes(same)}")


def publish_marker(client: redis.Redis, keys: Keys, node: str, marker: str, now: float) -> dict[str, str]:
    """Store this node's marker; the other nodes' markers, by node, those younger than the TTL (older
    ones are deleted) whose names are node names (a marker's name becomes a file name)."""
    key = keys.doctor("markers")
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, node, marker)
    pipe.expire(key, int(MARKER_TTL_S))
    pipe.hgetall(key)
    markers: dict[str, str] = pipe.execute()[-1]
    stale = [n for n, text in markers.items() if n != node and _age(text, now) > MARKER_TTL_S]
    if stale:
        client.hdel(key, *stale)
    return {n: t for n, t in markers.items() if n != node and n not in stale and _NODE_NAME.fullmatch(n)}


def _nodes(names: list[str]) -> str:
    return ("node " if len(names) == 1 else "nodes ") + ", ".join(names)


def _field(text: str, field: str) -> Any:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return json.loads(text).get(field)
    return None


def _age(text: str, now: float) -> float:
    at = _field(text, "at")
    return now - at if isinstance(at, int | float) else float("inf")


def _read_capped(path: Path) -> str | None:
    """A marker file's text (never through a symlink, at most a few KiB), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(_MARKER_MAX).decode(errors="replace")


# -- the ports and address of multi-node jobs ----------------------------------------------


def port_check(base: int, count: int, local_range: Path = Path("/proc/sys/net/ipv4/ip_local_port_range"),
               bindable: Callable[[int], bool] | None = None) -> Check:  # fmt: skip
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
        return Check(name, WARN, f"{address} ({given}): members of a multi-node job on other nodes cannot "
                     "reach a rank 0 here", f"{fix} (or make {cfg.node_name} resolve to it)")  # fmt: skip
    return Check(name, OK, f"{address} ({given})")


# -- all of them --------------------------------------------------------------------------


def with_installed_credentials(settings: Settings, root: Path = Path("/")) -> tuple[Settings, str]:
    """``settings`` with the Redis user and password file ``fleet install agent`` gave the agent's
    unit, when neither the file nor the environment gives any; and a note saying so, or ''."""
    from fleet.ops.install import installed_credentials

    given = (settings.redis_username, settings.redis_password, settings.redis_password_file)
    if any(v is not None for v in given):
        return settings, ""
    username, password_file = installed_credentials("agent", root)
    if username is None and password_file is None:
        return settings, ""
    changed = settings.model_copy(update={"redis_username": username, "redis_password_file": password_file})
    return changed, " (the installed agent unit's)"


def diagnose(settings: Settings, config: str | None = None) -> Iterator[Check]:
    """Every check, in order, each as soon as it is done."""
    cfg = settings.agent
    source = config or os.environ.get("FLEET_CONFIG") or "no config file, defaults and FLEET_*"
    yield Check("config", OK, f"{source}: node {cfg.node_name}, runtime {cfg.runtime}, gpus {cfg.gpus}")
    gpu_lines, gpus = gpu_checks(cfg)
    yield from gpu_lines
    runtime_lines, runtime = runtime_checks(cfg, gpus, settings.default_image)
    yield from runtime_lines
    yield cgroup_check(runtime)
    yield network_guard_check(cfg, runtime)
    settings, note = with_installed_credentials(settings)
    redis_line, client = redis_check(settings, note)
    yield redis_line
    keys = Keys(settings.key_prefix)
    if client is not None:
        try:
            before = time.time()
            redis_now = redis_clock(client, keys.doctor(f"clock:{cfg.node_name}"))
            yield clock_check(before, redis_now, time.time(), cfg.fence_margin_s)
        except redis.RedisError as exc:
            yield Check("clock", FAIL, f"cannot read Redis' clock: {exc}", "see the redis line")
    else:
        yield Check("clock", SKIP, "Redis did not answer")
    root = settings.checkpoint_root
    marker = new_marker(cfg.node_name, root, time.time())
    stored = checkpoint_check(root, cfg.node_name, marker, *job_identity(cfg))
    yield stored
    if client is None or stored.status == FAIL:
        yield Check("shared storage", SKIP, "needs Redis and a writable checkpoint_root")
    else:
        yield shared_check(client, keys, root, cfg.node_name, marker, time.time())
    ports = settings.controller
    yield port_check(ports.rendezvous_port_base, ports.rendezvous_ports)
    yield address_check(cfg)
    if client is not None:
        client.close()
