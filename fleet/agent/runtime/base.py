"""The Runtime interface: start, stop, list job attempts on one node, and read their output."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from fleet.models import Exit, Mount

#: where the Docker runtime mounts a job's checkpoint directory
CONTAINER_CHECKPOINT_DIR = "/fleet/checkpoint"
#: where the Docker runtime mounts an elastic attempt's control folder (read-only): its batch now
CONTAINER_CONTROL_DIR = "/fleet/control"
#: where the Docker runtime mounts the attempt's writable copy of a job's shipped directory, its
#: working directory
CONTAINER_WORKDIR = "/fleet/workdir"
#: where a container reads its forwarded stdin from (a named pipe, mounted read-only), as its stdin
CONTAINER_STDIN = "/fleet/stdin"
#: where a function job's runner (``fleet_worker.call``) reads its call, inside the job's outputs
#: directory (where it also leaves the outcome), which every runtime gives the job in its cwd
CALL_FILE = ".fleet-function/call"
#: where it reads the outcomes of the jobs whose results its call takes as arguments, one file each
INPUTS_DIR = ".fleet-function/inputs"
LABEL_JOB, LABEL_ATTEMPT, LABEL_NODE = "fleet.job", "fleet.attempt", "fleet.node"


@dataclass(frozen=True)
class LaunchSpec:
    job_id: str
    attempt: int
    image: str
    command: tuple[str, ...]
    env: dict[str, str]
    gpus: tuple[str, ...] = ()
    #: add a Docker device request for ``gpus`` (real GPUs only; simulated ones get the env vars)
    gpu_devices: bool = False
    cpus: float | None = None
    memory: int | None = None
    shm_size: int | None = None
    mounts: tuple[Mount, ...] = ()
    checkpoint_dir: Path | None = None
    #: checkpoint to resume from, relative to ``checkpoint_dir``
    resume_from: str | None = None
    #: (uid, gid) the job runs as; None: the runtime's own user (an agent that is not root)
    user: tuple[int, int] | None = None
    #: most processes (threads) the job may hold; None: no limit
    pids_limit: int | None = None
    #: the task's index when the job is a task of a job array (``FLEET_ARRAY_INDEX``)
    array_index: int | None = None
    #: a member of a multi-node job: its rank, how many members, where rank 0 listens; members
    #: reach each other over the hosts' network (the Docker runtime uses host networking for them)
    rank: int = 0
    members: int = 1
    master_addr: str = ""
    master_port: int = 0
    #: the job's shipped directory, unpacked on this node (read-only): the attempt works in a copy
    workdir: Path | None = None
    #: the directory, relative to the working directory, whose contents are kept when it ends
    outputs: str = "outputs"
    #: the job's global batch size (``FLEET_BATCH_SIZE``): an elastic job's at its current size
    batch_size: int | None = None
    #: an elastic job: fleet may change its batch while it runs, through a control folder
    #: (``FLEET_CONTROL_DIR``; :func:`fleet.agent.runtime.workspace.make_control`)
    control: bool = False
    #: the job's stdin is forwarded input (``spec.stdin``), a named pipe, not /dev/null
    stdin: bool = False
    #: a function job's call (``spec.call``'s bytes), written where its runner reads it (:data:`CALL_FILE`)
    call: bytes | None = None
    #: the outcomes of the jobs whose results the call takes (job id: bytes), written beside it
    inputs: dict[str, bytes] = field(default_factory=dict)

    def work_files(self) -> dict[str, bytes]:
        """What the runtime writes into the attempt's working directory before it starts: a function
        job's call, and the outcomes its arguments are taken from, in its outputs directory."""
        if self.call is None:
            return {}
        passed = {f"{self.outputs}/{INPUTS_DIR}/{job}": data for job, data in self.inputs.items()}
        return {f"{self.outputs}/{CALL_FILE}": self.call, **passed}

    @property
    def name(self) -> str:
        """The container's name; a member's carries its rank, as several nodes may share one daemon."""
        member = f"-rank{self.rank}" if self.members > 1 else ""
        return f"fleet-{self.job_id}-{self.attempt}{member}"

    def fleet_env(self, checkpoint_dir: str | None, control_dir: str | None = None) -> dict[str, str]:
        """The job's env plus what fleet promises every attempt: ids, GPUs (``FLEET_NUM_GPUS``: this
        member's), the global batch size when the job has one (and where an elastic one reads it
        again while it runs), checkpoint paths."""
        visible = ",".join(self.gpus)
        env = dict(self.env)
        env.update(
            FLEET_JOB_ID=self.job_id,
            FLEET_ATTEMPT=str(self.attempt),
            NVIDIA_VISIBLE_DEVICES=visible or "void",
            CUDA_VISIBLE_DEVICES=visible,
            FLEET_NUM_GPUS=str(len(self.gpus)),
        )
        if self.batch_size is not None:
            env["FLEET_BATCH_SIZE"] = str(self.batch_size)
        if control_dir:
            env["FLEET_CONTROL_DIR"] = control_dir
        if self.array_index is not None:
            env["FLEET_ARRAY_INDEX"] = str(self.array_index)
        if self.members > 1:  # what torchrun and torch.distributed read, and fleet's own names
            env.update(
                FLEET_NUM_NODES=str(self.members),
                FLEET_NODE_RANK=str(self.rank),
                MASTER_ADDR=self.master_addr,
                MASTER_PORT=str(self.master_port),
                WORLD_SIZE=str(self.members),
                NODE_RANK=str(self.rank),
            )
        if checkpoint_dir:
            env["FLEET_CHECKPOINT_DIR"] = checkpoint_dir
            if self.resume_from:
                env["FLEET_RESUME_FROM"] = f"{checkpoint_dir}/{self.resume_from}"
        return env


@dataclass(frozen=True)
class AttemptStatus:
    job_id: str
    attempt: int
    running: bool
    exit: Exit | None = None


@runtime_checkable
class Piped(Protocol):
    """A runtime whose attempts read forwarded input (``LaunchSpec.stdin``) from a named pipe."""

    def stdin_pipe(self, job_id: str, attempt: int) -> Path:
        """The pipe the attempt reads as its stdin, for the agent to write into."""
        ...

    def running(self, job_id: str, attempt: int) -> bool:
        """Whether the attempt still runs (False once it ended, or when it is not there)."""
        ...


@runtime_checkable
class Batched(Protocol):
    """A runtime that tells an elastic attempt a new batch while it runs (``LaunchSpec.control``)."""

    def set_batch(self, job_id: str, attempt: int, batch: int) -> bool:
        """Tell the attempt to run at global ``batch`` now; False when it has no control folder."""
        ...

    def batch_of(self, job_id: str, attempt: int) -> int | None:
        """The batch the attempt was last told (None: it has no control folder)."""
        ...


@runtime_checkable
class Lookup(Protocol):
    """A runtime that reads one attempt's status without listing every attempt."""

    def status(self, job_id: str, attempt: int) -> AttemptStatus | None: ...


def status_of(runtime: Runtime, job_id: str, attempt: int) -> AttemptStatus | None:
    """One attempt's status (None: the runtime does not hold it)."""
    if isinstance(runtime, Lookup):
        return runtime.status(job_id, attempt)
    return next((a for a in runtime.attempts() if (a.job_id, a.attempt) == (job_id, attempt)), None)


class Runtime(Protocol):
    name: str

    def start(self, spec: LaunchSpec) -> None:
        """Start the attempt; a no-op if it already exists. Raises LaunchError (ImageNotFound, ...)."""
        ...

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM to every process of the attempt's process group at once, then SIGKILL once
        ``grace_s`` (never rounded down) is over. Returns once the attempt no longer runs."""
        ...

    def attempts(self) -> list[AttemptStatus]:
        """Every attempt this runtime holds on this node, running or exited and not yet removed."""
        ...

    def remove(self, job_id: str, attempt: int) -> None: ...

    def work_dir(self, job_id: str, attempt: int) -> Path | None:
        """The attempt's working directory on this host while it is not removed (its spec's
        ``outputs`` are kept from it), or None where the runtime has none here."""
        ...

    def supervise(self, job_id: str, attempt: int) -> None:
        """Make sure the node supervisor fences this running attempt (after an agent restart)."""
        ...

    def pids(self) -> set[int]:
        """Host pids of every process fleet started on this node (to tell foreign GPU users apart)."""
        ...

    def read_logs(self, job_id: str, attempt: int, cursor: str | None, ended: bool) -> list[tuple[str, str]]:
        """(cursor, line) pairs the attempt wrote after ``cursor`` (None: from its start), at once,
        never waiting for more. A last line without its newline may still grow: it comes only once
        the attempt ``ended``. Nothing for an attempt the runtime does not hold (removed)."""
        ...

    def watch(self, on_exit: Callable[[str, int], None], stop: threading.Event) -> None:
        """Call ``on_exit(job_id, attempt)`` from a background thread whenever an attempt ends."""
        ...

    def close(self) -> None: ...


def exit_reason(code: int) -> str:
    """What an exit code says, with the signal's name where it is 128 + a signal."""
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"exited with code {code} ({signal.Signals(code - 128).name})"
    return f"exited with code {code}"
