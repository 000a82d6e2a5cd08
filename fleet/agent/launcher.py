"""Start an attempt the controller placed on this node: claim it, check its GPUs, build its launch
(image, user, limits, mounts, checkpoint and shipped directories, the results a call takes) and
start it through the runtime.

An attempt that cannot start ends through the exit path like any other (``exits.ExitPath.end``):
the job's fault (a spec this node refuses) fails it, the node's (a GPU busy, a directory it cannot
write) requeues it and counts against the node (``counts_against_node``). A start the supervisor
refused because the node's own lease lapsed requeues it too, and does not count: the node was slow.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

from fleet.agent import checkpoints
from fleet.agent.exits import ExitPath
from fleet.agent.gpucheck import check_assigned
from fleet.agent.inputs import passed_results
from fleet.agent.parts import Parts
from fleet.agent.runtime import LaunchSpec
from fleet.config_sections import AgentSettings
from fleet.errors import FleetError, GpuBusy, LaunchError, LeaseUnconfirmed, NotFound, SpecError
from fleet.log import event
from fleet.models import Exit, ExitKind, Fault, Job, JobSpec, JobState, MemberPhase, NodeState
from fleet.models.spec import MEMORY_MIN
from fleet.mounts import check_mounts
from fleet.outputs import storage_gid
from fleet.registries import check_image
from fleet.state import Stores
from fleet.workdir import MAX_BYTES, check_digest, unpack

log = logging.getLogger("fleet.agent")


class Launcher:
    def __init__(self, parts: Parts, exits: ExitPath) -> None:
        self.p, self.exits, self.node = parts, exits, parts.node
        stores = Stores.of(parts.settings, parts.jobs, parts.nodes)
        self.tenants, self.uids, self.blobs = stores.tenants, stores.uids, stores.blobs
        self._lock = threading.Lock()  # launches run on the bus worker's threads
        self._prepare_failures = 0  # attempts in a row this node could not prepare

    def launch(self, job_id: str, attempt: int) -> None:
        with self.p.inflight.held((job_id, attempt)) as claimed:
            if claimed:
                self._launch(job_id, attempt)

    def _launch(self, job_id: str, attempt: int) -> None:
        p = self.p
        try:
            job = p.jobs.get(job_id)
        except NotFound:
            event(log, "launch_ignored", job=job_id, attempt=attempt, why="no such job")
            return
        rank, gang = job.rank_on(self.node), len(job.members) > 1
        # a multi-node job is STARTING once its first member starts; the others start from there
        launchable = (JobState.SCHEDULED, JobState.STARTING) if gang else (JobState.SCHEDULED,)
        if rank is None or job.attempt != attempt or job.state not in launchable:
            where = ",".join(job.nodes_held) or "-"
            event(
                log,
                "launch_ignored",
                job=job_id,
                attempt=attempt,
                why=f"job is {job.state} attempt {job.attempt} on {where}",
            )
            return
        if gang and p.jobs.member(job, rank, MemberPhase.STARTING) < 0:
            event(log, "launch_ignored", job=job_id, attempt=attempt, why=f"member {rank} started already")
            return
        started = p.jobs.transition(
            job_id,
            attempt=attempt,
            allowed=launchable,
            to=JobState.STARTING,
            now=p.clock(),
            reason=f"starting on {self.node}" + (f" (member {rank} of {len(job.members)})" if gang else ""),
        )
        if not started:
            return
        # nothing runs until the placement and this start are on the replicas: a replica promoted
        # without them would place the job again, and it would run twice (NotReplicated: this
        # attempt is found STARTING and not running, and requeued)
        p.jobs.replicated(f"the start of job {job_id} attempt {attempt}")
        if job.cancel_requested:
            self.exits.end(job, Exit(fault=Fault.CANCEL, reason="cancelled before start"))
            return
        try:
            gpus = job.gpus_on(self.node)
            check_assigned(p.inventory, p.runtime, gpus, self.node, p.cfg.gpu_busy_memory)
            self._start(self._spec(job, rank))
        except (LaunchError, SpecError, OSError) as exc:
            self._launch_failed(job, exc)
            return
        with self._lock:
            self._prepare_failures = 0
        if not self._running(job, rank):
            # the controller gave up on this launch meanwhile (start deadline, cancel): its GPUs may
            # already be someone else's, so the attempt must not run on
            event(log, "stale_launch_stopped", job=job_id, attempt=attempt)
            p.runtime.stop(job_id, attempt, 0)
            self.exits.remove(job_id, attempt)
            return
        p.logs.follow(job_id, attempt, rank)
        p.stdin.follow(job, attempt, rank)
        event(
            log,
            "attempt_started",
            job=job_id,
            attempt=attempt,
            node=self.node,
            rank=rank,
            gpus=",".join(job.gpus_on(self.node)) or "-",
        )
        p.hints.name([job_id])

    def _start(self, spec: LaunchSpec) -> None:
        """Start the attempt; where the supervisor refused it for a lapsed lease (the heartbeat
        thread late on a starved node), heartbeat now and try once more: a heartbeat that reaches
        Redis confirms the lease again, and while none does the supervisor still refuses."""
        try:
            self.p.runtime.start(spec)
        except LeaseUnconfirmed as exc:
            event(log, "launch_lease_unconfirmed", job=spec.job_id, attempt=spec.attempt, error=exc)
            self.p.publish()
            self.p.runtime.start(spec)

    def _launch_failed(self, job: Job, exc: LaunchError | SpecError | OSError) -> None:
        """End an attempt that could not start: the job's fault (a spec this node refuses) fails it;
        the node's (a GPU busy, a workdir it cannot write, a lapsed lease) requeues it, and what
        ``counts_against_node`` counts toward the node's quarantine."""
        if isinstance(exc, OSError):
            exc = LaunchError(f"cannot prepare the attempt on {self.node}: {exc}", retryable=True)
        retryable = isinstance(exc, LaunchError) and exc.retryable
        kind = ExitKind.PREPARE if retryable else ExitKind.NONE
        kind = ExitKind.GPU_BUSY if isinstance(exc, GpuBusy) else kind
        kind = ExitKind.FENCED if isinstance(exc, LeaseUnconfirmed) else kind
        fault = Fault.INFRA if retryable else Fault.FATAL
        self.exits.end(job, Exit(reason=str(exc), fault=fault, kind=kind))
        if isinstance(exc, GpuBusy):
            self.p.publish()  # the busy GPU, before the job is placed again
        elif counts_against_node(exc):
            self._prepare_failed(str(exc))

    def _prepare_failed(self, why: str) -> None:
        """Count an attempt this node could not prepare (the node's fault, not the job's); after
        ``max_prepare_failures`` in a row the node cordons itself with the reason, so no more jobs
        are placed on it until an operator has fixed it and uncordons it. Its running jobs go on."""
        limit = self.p.cfg.max_prepare_failures
        with self._lock:
            self._prepare_failures += 1
            failures = self._prepare_failures
            if not limit or failures < limit:
                return
            self._prepare_failures = 0
        reason = (
            f"quarantined: {failures} attempts in a row could not be prepared on this node (last: "
            f"{why[:300]}); fix the node, then `fleet nodes uncordon {self.node}`"
        )
        try:
            cordoned = self.p.nodes.set_state(
                self.node,
                NodeState.CORDONED,
                reason,
                self.p.clock(),
                f"agent {self.node}",
                only_from=[NodeState.READY],
            )
        except FleetError as exc:
            event(log, "node_quarantine_failed", logging.WARNING, node=self.node, error=exc)
            return
        if cordoned:
            event(log, "node_quarantined", logging.WARNING, node=self.node, failures=failures, reason=why)

    def _running(self, job: Job, rank: int) -> bool:
        """The attempt runs here: the job is RUNNING (a multi-node job once every member runs);
        False when the launch went stale meanwhile."""
        if len(job.members) > 1:
            running = self.p.jobs.member(job, rank, MemberPhase.RUNNING)
            if running < 0:
                return False
            if running < len(job.members):
                return True  # the last member to run moves the job to RUNNING
        where = f"{len(job.members)} nodes" if len(job.members) > 1 else self.node
        return self.p.jobs.transition(
            job.id,
            attempt=job.attempt,
            allowed=[JobState.STARTING],
            to=JobState.RUNNING,
            reason=f"running on {where}",
            now=self.p.clock(),
            fields={"started_at": self.p.clock()},
        )

    # -- the launch ------------------------------------------------------------------

    def _spec(self, job: Job, rank: int = 0) -> LaunchSpec:
        settings, cfg, spec = self.p.settings, self.p.cfg, job.spec
        mounts = check_mounts(spec.mounts, settings.allowed_mounts)
        image = spec.image or settings.default_image
        check_image(image, settings.allowed_registries)
        user = self._job_user(spec)
        uid, gid = user if user else (None, None)
        shared = storage_gid(settings.storage_group)
        if shared is not None and gid == shared:
            raise SpecError(
                f"user: gid {gid} is the storage group's ({settings.storage_group}), which reads every "
                "tenant's kept outputs and checkpoints; run the job with another group"
            )
        ckpt = checkpoints.prepare(settings.checkpoint_root, job.id, job.attempt, uid, gid, shared)
        gpus = tuple(job.gpus_on(self.node))
        cpus, memory = job_limits(spec.cpus, spec.memory, len(gpus), cfg, self._capacity())
        return LaunchSpec(
            job_id=job.id,
            attempt=job.attempt,
            image=image,
            command=tuple(spec.command),
            env=dict(spec.env),
            gpus=gpus,
            gpu_devices=self.p.inventory.backend == "nvml",
            cpus=cpus,
            memory=memory,
            shm_size=spec.shm_size or cfg.default_shm_size,
            mounts=tuple(mounts),
            checkpoint_dir=ckpt,
            resume_from=checkpoints.latest(ckpt),
            user=user,
            pids_limit=cfg.pids_limit,
            array_index=job.array_index,
            rank=rank,
            members=max(len(job.members), 1),
            master_addr=job.master_addr,
            master_port=job.master_port,
            workdir=self._workdir(job),
            outputs=spec.outputs,
            batch_size=job.global_batch,
            control=job.spec.elastic,
            stdin=spec.stdin and rank == 0,
            call=self._call(job),
            inputs=passed_results(job, self.p.jobs, settings.checkpoint_root),
        )

    def _job_user(self, spec: JobSpec) -> tuple[int, int] | None:
        """Who the job runs as (``job_user``); its ``user`` checked against its tenant's record
        again here, since the record may have changed since the job was submitted."""
        cfg = self.p.cfg
        requested = self.tenants.policy(spec.tenant).check_user(spec.user) if spec.user else None
        return job_user(requested, cfg, lambda: self.uids.uid(spec.tenant, cfg.uid_range))

    def _capacity(self) -> tuple[float, int, int]:
        """What this node offers jobs, CPUs, memory and GPUs: never more CPUs or memory than the
        machine has (a limit past them is meaningless, and Docker refuses CPUs it does not have)."""
        cfg = self.p.cfg
        cpus, memory = os.cpu_count() or 1, psutil.virtual_memory().total
        offered = min(cfg.cpus or cpus, cpus), min(cfg.memory or memory, memory)
        return *offered, len(self.p.inventory.gpus())

    def _workdir(self, job: Job) -> Path | None:
        """The job's shipped directory, unpacked once per node (content-addressed, read-only)."""
        digest = job.spec.workdir
        if digest is None:
            return None
        folder = self.p.cfg.state_dir / "workdirs"
        unpacked = folder / check_digest(digest)
        if unpacked.is_dir():  # another attempt here unpacked it: no need to fetch it again
            return unpacked
        # 0711: a job reaches the tree it was given (read-only, its own digest) but cannot list the
        # digests of other tenants' trees
        checkpoints.traversable(folder)
        data = self.blobs.get(digest)
        if data is None:
            raise LaunchError(
                f"workdir {digest} is no longer stored (kept workdir_retention_s after its "
                "last upload or submit): submit the job again",
                retryable=False,
            )
        return unpack(data, digest, folder, max(self.p.settings.workdir_max_bytes, MAX_BYTES))

    def _call(self, job: Job) -> bytes | None:
        """A function job's call (its pickled function and arguments), as uploaded: never unpickled
        here, only handed to the job."""
        if job.spec.call is None:
            return None
        data = self.blobs.get(job.spec.call.blob)
        if data is None:
            raise LaunchError(
                f"call {job.spec.call.blob} of {job.spec.call.function} is no longer stored (a job "
                "holds its call while it exists, but one submitted before fleet did kept it "
                "workdir_retention_s after its upload or submit): submit the call again",
                retryable=False,
            )
        return bytes(data)


def counts_against_node(exc: LaunchError | SpecError) -> bool:
    """Whether a start that failed with ``exc`` counts toward the node's quarantine: the node could
    not prepare the attempt. Not the job's fault (a spec refused), a busy GPU (published, and the job
    placed elsewhere), nor a start refused because the node's own lease lapsed: its heartbeats were
    late, so it slows down (the attempt goes back to the queue), but nothing on it is broken."""
    if isinstance(exc, GpuBusy | LeaseUnconfirmed):
        return False
    return isinstance(exc, LaunchError) and exc.retryable


def job_user(
    requested: tuple[int, int] | None, cfg: AgentSettings, tenant_uid: Callable[[], int]
) -> tuple[int, int] | None:
    """(uid, gid) a job runs as: its spec's ``user`` (``requested``, allow-listed for its tenant),
    else the node's fixed ``job_user``, else its tenant's own uid (``tenant_uid``, the same number as
    gid). Root only where the operator allows it. An agent that is not root cannot
    switch users: None (its own), and a job that asked for another user is refused."""
    if requested is not None and requested[0] == 0 and not cfg.allow_root_jobs:
        raise SpecError(
            f"user: jobs may not run as root (uid 0) on node {cfg.node_name}; drop `user` to "
            "run as the tenant's own uid, or ask an operator to set allow_root_jobs"
        )
    fixed = cfg.fixed_user  # root only with allow_root_jobs (checked with the config)
    if os.geteuid() != 0:
        if requested is not None and requested[0] != os.geteuid():
            raise SpecError(
                f"user: node {cfg.node_name}'s agent is not root and runs jobs as uid "
                f"{os.geteuid()} only; drop `user`"
            )
        return None
    if requested is not None or fixed is not None:
        return requested or fixed
    uid = tenant_uid()
    return uid, uid


def job_limits(
    cpus: float | None, memory: int | None, gpus: int, cfg: AgentSettings, node: tuple[float, int, int]
) -> tuple[float, int]:
    """The CPUs and memory (bytes) an attempt holding ``gpus`` of this node is limited to: what its
    spec names, else the node's defaults (``AgentSettings.default_cpus`` and the rest). ``node``: the
    CPUs, memory and GPUs this node offers. Never more than the node offers."""
    node_cpus, node_memory, node_gpus = node
    if gpus:
        share = gpus / max(node_gpus, gpus)
        per_cpus, per_memory = cfg.default_cpus_per_gpu, cfg.default_memory_per_gpu
        cpus = cpus or (per_cpus * gpus if per_cpus else node_cpus * share)
        default = per_memory * gpus if per_memory else int(node_memory * share)
    else:
        cpus = cpus or cfg.default_cpus
        default = cfg.default_memory or int(node_memory * min(cpus / node_cpus, 1.0))
    return min(cpus, node_cpus), memory or max(min(default, node_memory), MEMORY_MIN)
