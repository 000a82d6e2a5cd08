"""Attempts as Docker containers, through the Docker Engine API (docker-py).

Containers are named ``fleet-<job>-<attempt>`` and labelled with job, attempt and node, so a
restarted agent finds its own by label. Never privileged: every capability dropped,
``no-new-privileges``, the job's user (never root unless the operator allows it), a pids limit;
``init=True`` so zombies are reaped and signals reach the job: docker-init (tini) is told
(``TINI_KILL_PROCESS_GROUP``) to pass a stop's SIGTERM to the job's whole process group, as the
process runtime sends it, so a training process behind a wrapper shell gets it too. Each started
container's init is handed to the node supervisor, which kills it if the node's lease lapses, agent
or no agent. Exits are seen through Docker events, and the agent's periodic reconcile lists
containers by label in case one was missed. Single-node jobs run on fleet's guarded network,
multi-node members on the host's (see :mod:`fleet.agent.netguard`), unless the operator turned the
guard off.

Each attempt has a working directory on the host as the process runtime's
(:mod:`fleet.agent.runtime.workspace`, ``<root>/<job>.<attempt>/work``, the job's, 0700),
bind-mounted writable, so what the job leaves in its ``outputs`` directory is on the host when it
ends, kept by the same code as a process's (:mod:`fleet.agent.outputs`) without reading anything out
of the container. With a shipped directory, ``work`` is its copy and is mounted at
``/fleet/workdir``, the working directory. Without one the job starts in its image's ``WORKDIR``
(``/`` when it names none), and only ``work/<outputs>`` is mounted there, at
``<WORKDIR>/<outputs>``: the image's files stay as they are. A job that reads forwarded stdin has a
named pipe beside ``work``, mounted read-only at ``/fleet/stdin``, which ``/bin/sh`` opens as the
stdin of the image's entrypoint and command (:mod:`fleet.agent.stdin`). An elastic job's control
folder (its batch now) is mounted read-only at ``/fleet/control``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import posixpath
import shutil
import threading
import time
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import docker
import psutil
from docker.errors import APIError, DockerException, NotFound
from docker.errors import ImageNotFound as DockerImageNotFound
from docker.types import DeviceRequest, Mount

from fleet.agent.checkpoints import traversable
from fleet.agent.netguard import NetGuard
from fleet.agent.runtime.base import (
    CONTAINER_CHECKPOINT_DIR,
    CONTAINER_CONTROL_DIR,
    CONTAINER_STDIN,
    CONTAINER_WORKDIR,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_NODE,
    AttemptStatus,
    LaunchSpec,
)
from fleet.agent.runtime.workspace import AttemptFolders, make_control, make_stdin_pipe, make_work
from fleet.agent.supervision import SupervisorClient
from fleet.config_sections import AgentSettings
from fleet.errors import ConfigError, ImageNotFound, LaunchError, RuntimeUnavailable
from fleet.log import event
from fleet.models import Exit

log = logging.getLogger("fleet.agent.docker")
MiB = 1 << 20
#: images under this name exist only where they were built (``make images``): never pulled
LOCAL_REGISTRY = "localhost/"
#: makes docker-init (tini) signal the job's process group, as ``tini -g`` does, not its main process
KILL_PROCESS_GROUP = "TINI_KILL_PROCESS_GROUP"
#: Docker's OOM flag can land after the exit it caused (seconds later on a busy node): a SIGKILL exit
#: of a container with a memory limit is read again for this long after it ended (only such an exit)
OOM_SETTLE_S = 3.0
#: lines asked for per log read: enough for a round's output, few enough to find from the log's end
_TAIL = 1000


class DockerRuntime(AttemptFolders):
    name = "docker"

    def __init__(
        self,
        node: str,
        root: Path,
        supervisor: SupervisorClient,
        pull: str = "missing",
        client: Any = None,
        guard: AgentSettings | None = None,
    ) -> None:
        """``root``: where attempts' working directories live on this host (dockerd's: it mounts
        them); ``guard``: the settings of the network guard, None to run jobs on Docker's default
        bridge."""
        self.node, self.root, self.supervisor, self.pull = node, root, supervisor, pull
        traversable(root)
        try:
            self.client = client or docker.from_env(timeout=30)
            self.client.ping()
            self.guard = NetGuard(self.client, guard) if guard is not None else None
            if self.guard is not None:
                self.guard.ensure()
        except DockerException as exc:
            raise RuntimeUnavailable(f"Docker daemon not reachable: {exc}") from exc
        self._events: Any = None
        self._names: dict[tuple[str, int], str] = {}
        self._ooms: set[tuple[str, int]] = set()  # "oom" events: 20.10 drops one after the exit

    def _filters(self, **extra: str) -> dict[str, Any]:
        return {"label": [f"{LABEL_NODE}={self.node}", *(f"{k}={v}" for k, v in extra.items())]}

    def _listed(self, labels: dict[str, str] | None = None, every: bool = True) -> list[Any]:
        """This node's containers with ``labels`` (``every``: exited too); one gone meanwhile left out."""
        filters = self._filters(**(labels or {}))
        return list(self.client.containers.list(all=every, filters=filters, ignore_removed=True))

    def _container(self, job_id: str, attempt: int) -> Any:
        return next(iter(self._listed({LABEL_JOB: job_id, LABEL_ATTEMPT: str(attempt)})), None)

    # -- start -----------------------------------------------------------------------

    def start(self, spec: LaunchSpec) -> None:
        try:
            if spec.stdin:  # held before the job can open it: it reads no EOF before its input ends
                pipe = make_stdin_pipe(self._dir(spec.job_id, spec.attempt), spec.user)
                self.supervisor.stdin_hold(f"{spec.job_id}.{spec.attempt}", pipe)
            container = self._container(spec.job_id, spec.attempt) or self._create(spec)
            self._names[(spec.job_id, spec.attempt)] = container.name
            if container.status == "created":
                if spec.stdin:
                    self._need_shell(spec.image, container)
                container.start()
            self._supervise(spec.job_id, spec.attempt, container)
        except LaunchError:
            self.remove(spec.job_id, spec.attempt)
            raise
        except DockerImageNotFound as exc:
            hint = (
                "; it is built on each node (make images), never pulled"
                if spec.image.startswith(LOCAL_REGISTRY)
                else ""
            )
            raise ImageNotFound(f"image {spec.image!r} not found on node {self.node}{hint}") from exc
        except APIError as exc:
            raise LaunchError(f"docker refused to start the container: {exc.explanation or exc}") from exc
        except DockerException as exc:
            raise LaunchError(f"docker failed: {exc}", retryable=True) from exc

    def supervise(self, job_id: str, attempt: int) -> None:
        """Put a running container found on the node (agent restart) back under the fence."""
        container = self._container(job_id, attempt)
        if container is not None:
            self._supervise(job_id, attempt, container)

    def _supervise(self, job_id: str, attempt: int, container: Any) -> None:
        """Hand the container's init to the node supervisor, which fences it with the lease."""
        container.reload()
        pid = int(container.attrs["State"].get("Pid") or 0)
        if pid:
            self.supervisor.adopt(f"{job_id}.{attempt}", pid)

    def _need_shell(self, image: str, container: Any) -> None:
        """Refuse an image without ``/bin/sh``, which gives the job its stdin (else: tini's 127)."""
        api = self.client.api
        found = api.head(api._url("/containers/{0}/archive", container.id), params={"path": "/bin/sh"})
        if found.status_code == 404:
            raise LaunchError(
                f"stdin: image {image!r} has no /bin/sh, which gives a container its forwarded input; use "
                "an image with a shell (busybox's will do), or submit without stdin (fleet run --no-stdin)"
            )

    def _ensure_image(self, image: str) -> Any:
        try:
            return self.client.images.get(image)
        except DockerImageNotFound:
            if self.pull == "never" or image.startswith(LOCAL_REGISTRY):
                raise
        try:
            event(log, "image_pull", image=image, node=self.node)
            return self.client.images.pull(image)
        except DockerException as exc:
            raise ImageNotFound(
                f"image {image!r} not found on node {self.node} and pull failed: "
                f"{getattr(exc, 'explanation', None) or exc}"
            ) from exc

    def _create(self, spec: LaunchSpec) -> Any:
        image = self._ensure_image(spec.image)
        checkpoint = CONTAINER_CHECKPOINT_DIR if spec.checkpoint_dir else None
        mounts = [Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts]
        if spec.checkpoint_dir:
            mounts.append(Mount(CONTAINER_CHECKPOINT_DIR, str(spec.checkpoint_dir), type="bind"))
        folder = self._dir(spec.job_id, spec.attempt)
        if spec.workdir is not None:  # its copy, writable, the working directory
            work = make_work(folder, spec.workdir, spec.user, files=spec.work_files())
            mounts.append(Mount(CONTAINER_WORKDIR, str(work), type="bind"))
        else:  # the image's working directory, with the job's outputs directory mounted in it
            work = make_work(folder, None, spec.user, spec.outputs, files=spec.work_files())
            cwd = (image.attrs.get("Config") or {}).get("WorkingDir") or "/"
            mounts.append(Mount(posixpath.join(cwd, spec.outputs), str(work / spec.outputs), type="bind"))
        control = None
        if made := make_control(folder, spec):  # an elastic job's batch now, which may change as it runs
            mounts.append(Mount(CONTAINER_CONTROL_DIR, str(made), type="bind", read_only=True))
            control = CONTAINER_CONTROL_DIR
        # no user of its own: this agent's (it may not hand out another), as in the process runtime
        user = spec.user or (os.getuid(), os.getgid())
        devices = (
            [DeviceRequest(device_ids=list(spec.gpus), capabilities=[["gpu"]])] if spec.gpu_devices else []
        )
        # a multi-node job's members meet on the hosts' addresses (MASTER_ADDR:MASTER_PORT and the
        # ports NCCL/gloo open): host networking, as Slurm and most bare-metal stacks run them
        network = "host" if spec.members > 1 else self._network()
        command, entrypoint = list(spec.command), None
        if spec.stdin:  # the image's entrypoint and the command, with the pipe as their stdin
            config = image.attrs.get("Config") or {}
            shell = ["/bin/sh", "-c", f'exec "$@" <{CONTAINER_STDIN}', "sh"]
            entrypoint = shell + list(config.get("Entrypoint") or [])
            command = command or list(config.get("Cmd") or [])
            mounts.append(Mount(CONTAINER_STDIN, str(folder / "stdin"), type="bind", read_only=True))
        return self.client.containers.create(
            spec.image,
            command,
            entrypoint=entrypoint,
            name=spec.name,
            labels={LABEL_JOB: spec.job_id, LABEL_ATTEMPT: str(spec.attempt), LABEL_NODE: self.node},
            environment={**spec.fleet_env(checkpoint, control), KILL_PROCESS_GROUP: "1"},
            init=True,
            privileged=False,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user=f"{user[0]}:{user[1]}",
            pids_limit=spec.pids_limit,
            mounts=mounts,
            device_requests=devices,
            mem_limit=spec.memory,
            memswap_limit=spec.memory,
            nano_cpus=int(spec.cpus * 1e9) if spec.cpus else None,
            shm_size=spec.shm_size,
            working_dir=CONTAINER_WORKDIR if spec.workdir is not None else None,
            network_mode=network,
        )

    def _network(self) -> str | None:
        """The guarded network (made again if someone removed it), or None: Docker's default bridge."""
        if self.guard is None:
            return None
        try:
            return self.guard.ensure()
        except ConfigError as exc:
            raise LaunchError(f"node {self.node}: {exc}", retryable=True) from exc

    # -- observe ---------------------------------------------------------------------

    def attempts(self) -> list[AttemptStatus]:
        return [self._status(c) for c in self._listed()]

    def _status(self, container: Any) -> AttemptStatus:
        job_id, attempt = container.labels[LABEL_JOB], int(container.labels[LABEL_ATTEMPT])
        state = container.attrs["State"]
        if state.get("Running") or container.status in ("created", "restarting"):
            return AttemptStatus(job_id, attempt, True)
        code, oom = int(state.get("ExitCode", -1)), self._oom_killed(container)
        limit, reason = container.attrs["HostConfig"].get("Memory") or 0, f"exited with code {code}"
        if oom:
            reason = f"OOMKilled (memory limit {limit // MiB} MiB)" if limit else "OOMKilled"
        elif state.get("Error"):
            reason = f"container error: {state['Error']}"
        return AttemptStatus(job_id, attempt, False, Exit(code=code, oom=oom, reason=reason))

    def _oom_killed(self, container: Any) -> bool:
        """Whether the kernel's OOM killer ended the container: Docker's flag, or its "oom" event. A
        SIGKILL exit of a container with a memory limit is read again for ``OOM_SETTLE_S`` after it ended."""
        key, settled = (container.labels[LABEL_JOB], int(container.labels[LABEL_ATTEMPT])), 0.0
        while not (container.attrs["State"].get("OOMKilled") or key in self._ooms):
            state = container.attrs["State"]
            if state.get("ExitCode") != 137 or not container.attrs["HostConfig"].get("Memory"):
                return False
            settled = settled or float(_epoch(state.get("FinishedAt", ""))) + OOM_SETTLE_S
            if time.time() >= settled:
                return False
            time.sleep(0.1)
            with contextlib.suppress(NotFound):
                container.reload()
        return True

    def pids(self) -> set[int]:
        found: set[int] = set()
        for container in self._listed(every=False):
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(container.attrs["State"]["Pid"])
                found.update(p.pid for p in [root, *root.children(recursive=True)])
        return found

    def read_logs(self, job_id: str, attempt: int, cursor: str | None, ended: bool) -> list[tuple[str, str]]:
        """The cursor is the line's timestamp, to the nanosecond. Docker keeps a partial line until
        its newline or the container's end, so ``ended`` changes nothing here."""
        # ``since`` keeps lines at or after it; a float may round up past the next line's nanosecond,
        # so ask from a microsecond earlier and compare exactly below
        since = float(cursor) - 1e-6 if cursor else None
        try:
            name = self._names.get((job_id, attempt)) or self._find_name(job_id, attempt)
            if name is None:
                return []
            raw = self._logs(name, since, _TAIL)
            if len(raw) >= _TAIL:  # maybe more before them
                raw = self._logs(name, since, "all")
        except NotFound:
            return []
        except DockerException as exc:
            raise RuntimeUnavailable(f"docker logs of fleet-{job_id}-{attempt} failed: {exc}") from exc
        lines = map(_stamped, raw)
        return [(c, text) for c, text in lines if cursor is None or Decimal(c) > Decimal(cursor)]

    def _find_name(self, job_id: str, attempt: int) -> str | None:
        """The attempt's container's name (a member's carries its rank), found by its labels once."""
        container = self._container(job_id, attempt)
        if container is not None:
            self._names[(job_id, attempt)] = container.name
        return container.name if container is not None else None

    def _logs(self, name: str, since: float | None, tail: int | str) -> list[bytes]:
        """Docker finds the last ``tail`` lines without reading the whole log, then applies ``since``."""
        raw = self.client.api.logs(name, timestamps=True, since=since, tail=tail, stream=False)
        return [line for line in bytes(raw).split(b"\n") if line]

    def watch(self, on_exit: Callable[[str, int], None], stop: threading.Event) -> None:
        threading.Thread(target=self._watch, args=(on_exit, stop), name="docker-events", daemon=True).start()

    def _watch(self, on_exit: Callable[[str, int], None], stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                filters = {"type": "container", "event": ["die", "oom"], **self._filters()}
                self._events = self.client.events(decode=True, filters=filters)
                for ev in self._events:
                    labels = ev.get("Actor", {}).get("Attributes", {})
                    key = (labels.get(LABEL_JOB), int(labels.get(LABEL_ATTEMPT, 0)))
                    if key[0] and ev.get("Action", ev.get("status")) == "oom":
                        self._ooms.add(key)
                    elif key[0]:
                        on_exit(*key)
            except Exception as exc:  # the reconcile loop covers the gap; keep watching
                if not stop.is_set():
                    event(log, "docker_events_lost", logging.WARNING, error=exc)
                    stop.wait(1.0)

    # -- stop ------------------------------------------------------------------------

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        container = self._container(job_id, attempt)
        if container is not None and container.status in ("running", "created", "restarting"):
            with contextlib.suppress(NotFound):
                # Docker counts the grace in whole seconds: rounded up, a grace is never cut short
                container.stop(timeout=max(math.ceil(grace_s), 0))

    def running(self, job_id: str, attempt: int) -> bool:
        container = self._container(job_id, attempt)
        return container is not None and container.status in ("running", "created", "restarting")

    def remove(self, job_id: str, attempt: int) -> None:
        self._names.pop((job_id, attempt), None)
        self._ooms.discard((job_id, attempt))
        container = self._container(job_id, attempt)
        if container is not None:
            with contextlib.suppress(NotFound):
                container.remove(force=True)
        self.supervisor.forget_fence(f"{job_id}.{attempt}")
        if self.stdin_pipe(job_id, attempt).exists():  # the supervisor's end goes, container or not
            self.supervisor.stdin_end(f"{job_id}.{attempt}")
        shutil.rmtree(self._dir(job_id, attempt), ignore_errors=True)

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._events.close()
        self.client.close()
        self.supervisor.close()


def _stamped(raw: bytes) -> tuple[str, str]:
    """(cursor, text) from a ``<RFC 3339 timestamp> <text>`` line of ``docker logs --timestamps``."""
    stamp, _, text = raw.decode(errors="replace").partition(" ")
    return _epoch(stamp), text


def _epoch(stamp: str) -> str:
    """Epoch seconds to the ns of Docker's ``2026-11-21T18:47:00.123456789Z``: ``1795286820.123456789``."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        seconds = int(datetime.fromisoformat(head + "+00:00").timestamp())
    except ValueError:
        return f"{time.time():.9f}"
    return f"{seconds}.{(frac or '0')[:9]:0<9}"
