"""A job as stored, its states and history, job arrays, log lines and queue positions."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.errors import SpecError
from fleet.models.base import _LAZY
from fleet.models.spec import JobSpec, Range


class JobState(StrEnum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def on_node(self) -> bool:
        return self in ON_NODE_STATES

    @classmethod
    def parse(cls, state: JobState | str | None) -> JobState | None:
        """``state`` in any case (None or '' for any state); :class:`SpecError` naming the states."""
        if state is None or state == "":
            return None
        try:
            return cls(str(state).upper())
        except ValueError:
            raise SpecError(f"state {state!r}: expected one of {', '.join(s.value for s in cls)}") from None


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: states in which a job is bound to a node and holds GPU claims
ON_NODE_STATES = (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING)


#: a key of ``Job.speeds``: "<GPUs>x<global batch>"
SPEED_KEY = re.compile(r"(\d{1,6})x(\d{1,9})")


class Fault(StrEnum):
    """Who is to blame for how an attempt ended (``Exit.fault``; the values are stored)."""

    #: the job's own: a retry spends its ``max_attempts`` budget
    JOB = "job"
    #: the node's or fleet's: requeued without spending the budget (up to ``max_infra_requeues``)
    INFRA = "infra"
    #: the job's, and another attempt would fail alike: failed at once
    FATAL = "fatal"
    #: the user cancelled it: the job ends CANCELLED
    CANCEL = "cancel"


class ExitKind(StrEnum):
    """What ended an attempt, beyond whose fault it was (``Exit.kind``; stored, and the label of
    the ``fleet_requeues`` metric)."""

    NONE = ""
    #: an assigned GPU held a process fleet did not start (the agent refused the launch)
    GPU_BUSY = "gpu_busy"
    #: the node could not prepare the attempt (workdir, checkpoint directory, supervisor)
    PREPARE = "prepare"
    #: the node's supervisor stopped it: the node lost its lease
    FENCED = "fenced"
    #: stopped to restart at a new size (elastic): neither budget is spent
    RESIZE = "resize"
    #: stopped for a job of a tenant below its guarantee
    PREEMPTED = "preempted"
    #: stopped at its node's drain deadline
    DRAIN = "drain"
    #: stopped at its time limit (``timeout``)
    TIMEOUT = "timeout"
    #: it vanished from its node (the runtime holds no such attempt)
    LOST = "lost"
    #: its node (or a member's node) went down
    NODE_DOWN = "node_down"
    #: placed, but not started within the launch deadlines
    LAUNCH_TIMEOUT = "launch_timeout"


class RequeueKind(StrEnum):
    """What the ``fleet_requeues`` metric counts a requeue under when its exit names no kind."""

    JOB_FAILURE = "job_failure"
    INFRASTRUCTURE = "infrastructure"


class MemberPhase(StrEnum):
    """Where one member of a multi-node job stands (``Job.member_phases``; stored by member.lua)."""

    #: not started yet
    NONE = ""
    STARTING = "starting"
    RUNNING = "running"
    #: ended with 0: the job is done once every member is
    DONE = "done"
    #: ended by itself with an error (see fleet.agent.members)
    FAILED = "failed"


class Exit(BaseModel):
    """How one attempt ended, as the agent saw it."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    code: int | None = None
    oom: bool = False
    reason: str = ""
    #: who is to blame (see :class:`Fault`)
    fault: Fault = Fault.JOB
    #: what ended it, for the requeue policy and metrics (see :class:`ExitKind`)
    kind: ExitKind = ExitKind.NONE

    @property
    def succeeded(self) -> bool:
        """The program ended by itself with 0."""
        return self.code == 0 and self.fault == Fault.JOB

    @property
    def requeue_kind(self) -> str:
        """What a requeue after this exit is counted as (the ``fleet_requeues`` metric's ``kind``)."""
        if self.kind:
            return self.kind.value
        return (RequeueKind.JOB_FAILURE if self.fault == Fault.JOB else RequeueKind.INFRASTRUCTURE).value


@dataclass(frozen=True)
class Decision:
    """What becomes of a job whose attempt ended (``fleet.lifecycle.decide`` makes it; the store
    applies it): its next state, the delay before it may be placed again, why, and the counters
    to bump."""

    state: JobState
    delay: float
    reason: str
    incr: dict[str, int] = field(default_factory=dict)


class Member(BaseModel):
    """One node's part of a multi-node job."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    node: str
    gpus: list[str] = Field(default_factory=list)


class Progress(BaseModel):
    """The last progress report of a job's current attempt (``fleet_worker.progress`` in the job)."""

    step: int = Field(ge=0)
    #: steps in the whole run, when the job said (what a bar is drawn against)
    total: int | None = Field(default=None, ge=1)
    #: when the job reported it (unix seconds)
    at: float = 0.0
    #: anything else the job reported with it (loss, samples/s, ...)
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        """Done so far, 0..1, or None without a total."""
        return None if self.total is None else min(1.0, self.step / self.total)


class Job(BaseModel):
    """A job as stored: its spec plus where it stands."""

    model_config = _LAZY

    id: str
    spec: JobSpec
    state: JobState
    attempt: int = 0
    failures: int = 0
    infra_requeues: int = 0
    node: str | None = None
    gpus: list[str] = Field(default_factory=list)
    reason: str = ""
    exit_code: int | None = None
    #: the user whose token submitted it ('' for jobs stored without the API)
    owner: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    not_before: float = 0.0
    cancel_requested: bool = False
    #: who holds it back from placement (``fleet hold``), '' when nobody does: it stays QUEUED
    #: until released
    held_by: str = ""
    #: bumped by each change of a queued job (hold, release, update): a placement decided from an
    #: older read of the job is refused (place_many.lua)
    rev: int = 0
    #: why fleet asked the attempt to stop for reasons not the job's (drain, preemption), or ""
    preempt: str = ""
    #: the waiting job this attempt is being stopped for (a preemption), or ""
    preempted_for: str = ""
    checkpoint: str | None = None
    #: what is kept of the spec's ``outputs`` directory: its bytes and the attempt it is from (None,
    #: 0: nothing kept), and why something was not kept (quota, links skipped), or ""
    outputs_bytes: int | None = None
    outputs_attempt: int = 0
    outputs_note: str = ""
    #: the current attempt's last progress report, or None
    progress: Progress | None = None
    seq: int = 0
    #: how an attempt ended, written before its container is removed (see JobStore.record_exit)
    last_exit: Exit | None = None
    last_exit_attempt: int = 0
    #: when the job entered its current state (launch deadlines count from it)
    state_since: float = 0.0
    #: a multi-node job's current attempt: its members (node, GPUs) rank 0 first (rank 0's are
    #: ``node`` and ``gpus`` too), where they meet (rank 0's address and a port reserved there),
    #: and how many members run and how many ended with 0; empty for a single-node job
    members: list[Member] = Field(default_factory=list)
    master_addr: str = ""
    master_port: int = 0
    members_running: int = 0
    members_done: int = 0
    #: each member's phase, by rank
    member_phases: list[MemberPhase] = Field(default_factory=list)
    #: for a task of a job array: the array's id, the task's index (``FLEET_ARRAY_INDEX``) and how many
    #: of the array's tasks may be on nodes at once (None: no limit); None for a job submitted alone
    array_id: str | None = None
    array_index: int | None = None
    array_max_running: int | None = None
    #: an elastic job's size (GPUs, global batch) now (queued: next), 0 until sized; sized when; resizes
    num_gpus: int = 0
    batch_size: int = 0
    sized_at: float = 0.0
    resizes: int = 0
    #: where a resize under way takes it (0 GPUs: back to the queue until GPUs are free), or None
    resize_gpus: int | None = None
    resize_batch: int = 0
    #: an elastic job's measured samples/s at each size it ran at, ``"<GPUs>x<global batch>"``: what
    #: its attempts reported (``fleet_worker.report``), newer reports weighing more
    speeds: dict[str, float] = Field(default_factory=dict)
    #: an elastic job's gradient noise scale in samples, as last reported (``fw.report(gns=...)``)
    noise_scale: float = 0.0
    #: GPU-seconds its ended attempts ran; when its current attempt began RUNNING (None: never)
    used_gpu_s: float = 0.0
    running_from: float | None = None

    def attained_gpu_s(self, now: float) -> float:
        """GPU-seconds it has run so far, its current attempt's included (least attained service)."""
        since = self.running_from if self.state == JobState.RUNNING else None
        return self.used_gpu_s + (max(now - since, 0.0) * self.gpu_count if since is not None else 0.0)

    @property
    def measured(self) -> dict[tuple[int, int], float]:
        """``speeds`` by (GPUs, global batch), sizes ascending."""
        found = ((SPEED_KEY.fullmatch(k), v) for k, v in self.speeds.items())
        return dict(sorted(((int(m[1]), int(m[2])), v) for m, v in found if m))

    @property
    def gpu_count(self) -> int:
        """GPUs of the current attempt (queued: of the next): the spec's, or an elastic job's size."""
        return self.num_gpus if isinstance(self.spec.gpus, Range) else self.spec.gpus

    @property
    def global_batch(self) -> int | None:
        """``FLEET_BATCH_SIZE``: an elastic job's current batch, else the spec's one value (or None)."""
        if self.spec.elastic and self.batch_size:
            return self.batch_size
        return self.spec.batch_size if isinstance(self.spec.batch_size, int) else None

    @property
    def nodes_held(self) -> list[str]:
        """The nodes the current attempt is bound to: every member's, rank 0 first, or its one node."""
        if self.members:
            return [m.node for m in self.members]
        return [self.node] if self.node else []

    def rank_on(self, node: str) -> int | None:
        """The rank of the member on ``node`` (0 for a single-node job there), or None."""
        held = self.nodes_held
        return held.index(node) if node in held else None

    def gpus_on(self, node: str) -> list[str]:
        rank = self.rank_on(node)
        if rank is None:
            return []
        return self.members[rank].gpus if self.members else self.gpus


class JobArray(BaseModel):
    """A job array as stored (its spec once, for every task) with how its tasks stand."""

    model_config = _LAZY

    kind: Literal["array"] = "array"
    id: str
    #: the spec every task runs; each task adds the labels ``fleet.array`` and ``fleet.array.index``
    spec: JobSpec
    #: the indices in normal form: ``0-9999``, ``1,3,5-9``
    indices: str
    size: int
    #: most tasks on nodes (SCHEDULED, STARTING, RUNNING) at once; None: no limit
    max_running: int | None = None
    owner: str = ""
    created_at: float = 0.0
    #: submission seq of its first task (arrays and jobs list in this order)
    seq: int = 0
    #: tasks in each state (every state present)
    tasks: dict[JobState, int] = Field(default_factory=dict)
    #: ids of its first FAILED tasks (at most 20), lowest index first
    failed: list[str] = Field(default_factory=list)

    @property
    def on_nodes(self) -> int:
        return sum(self.tasks.get(s, 0) for s in ON_NODE_STATES)

    @property
    def done(self) -> bool:
        return sum(self.tasks.get(s, 0) for s in FINAL_STATES) >= self.size


class CancelReport(BaseModel):
    """What a bulk cancel did: jobs cancelled at once (queued), jobs whose agents were told to stop
    them (on nodes: CANCELLED once stopped), and how many were already final."""

    model_config = _LAZY

    cancelled: list[str] = Field(default_factory=list)
    stopping: list[str] = Field(default_factory=list)
    already_final: int = 0
    #: ids named that no job holds (a cancel of several ids goes on past them)
    not_found: list[str] = Field(default_factory=list)


class RequeueReport(BaseModel):
    """What ``fleet requeue ARRAY`` did: the tasks queued again (each its next attempt, under its own
    id), and how many tasks were left as they were (in another state) or are gone (retention)."""

    model_config = _LAZY

    requeued: list[str] = Field(default_factory=list)
    left: int = 0
    gone: int = 0


class Event(BaseModel):
    """One entry of a job's history."""

    model_config = _LAZY

    at: float
    state: str
    attempt: int
    reason: str
    node: str | None = None


class LogLine(BaseModel):
    """One line of a job's output; ``id`` is its place in the attempt's log stream (a cursor)."""

    id: str
    attempt: int
    line: str

    @property
    def at(self) -> float:
        """When it was shipped (unix seconds): the stream entry id's milliseconds."""
        return int(self.id.split("-", 1)[0]) / 1000


class QueuePosition(BaseModel):
    """Where a QUEUED job stands: jobs ahead of it by rank (priority, then submission), in its tenant
    and in the whole queue. Tenants take turns by fair share, so the overall figure is how many
    outrank it, not the order the fleet will start them in."""

    tenant: str
    #: 1 = next in its tenant
    in_tenant: int
    tenant_queued: int
    overall: int
    queued: int


class QueuedJob(BaseModel):
    """A QUEUED job with where it stands (the status page's queue lists these)."""

    model_config = _LAZY

    job: Job
    position: QueuePosition
