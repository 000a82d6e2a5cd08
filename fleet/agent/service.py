"""The node agent: heartbeats its lease, launches what the controller assigned, reports exits.

It never decides placement. Messages make it act now; ``reconcile`` makes the same decisions
from Redis state and the runtime's own list of attempts, so a lost or duplicated message
changes nothing, and a restarted agent reattaches to the attempts still running.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from fleet import checkpoints, metrics
from fleet.agent import reconcile as plan
from fleet.agent.gpucheck import await_released, check_assigned
from fleet.agent.gpus import GpuInventory, busy_reason
from fleet.agent.logship import LogShipper
from fleet.agent.members import member_failed
from fleet.agent.runtime import AttemptStatus, LaunchSpec, Runtime
from fleet.agent.supervision import SupervisorClient
from fleet.agent.sweep import sweep
from fleet.bus import CONTROLLER_QUEUE, AttemptUpdate, Bus, Launch, NodeChanged, Stop, node_queue
from fleet.config import AgentSettings, Settings
from fleet.errors import FleetError, GpuBusy, LaunchError, NotFound, SpecError
from fleet.lifecycle import CANCEL, FATAL, INFRA, JOB, RESIZE, TAIL_LINES, RetryPolicy, explain
from fleet.log import StepHealth, event
from fleet.models import Exit, Job, JobSpec, JobState, NodeState
from fleet.models.spec import MEMORY_MIN
from fleet.mounts import check_mounts
from fleet.registries import check_image
from fleet.sdnotify import Notifier
from fleet.state import JobStore, NodeStore
from fleet.state.blobs import BlobStore
from fleet.state.connection import connect_binary
from fleet.state.nodes import NodeInfo
from fleet.state.retention import RetentionStore
from fleet.state.tenants import TenantStore
from fleet.state.uids import JobUids
from fleet.versions import VERSION
from fleet.workdir import MAX_BYTES, check_digest, clean_temp, unpack

log = logging.getLogger("fleet.agent")


class Agent:
    def __init__(
        self,
        settings: Settings,
        jobs: JobStore,
        nodes: NodeStore,
        bus: Bus,
        inventory: GpuInventory,
        runtime: Runtime,
        supervisor: SupervisorClient,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.cfg = settings, settings.agent
        self.address = self.cfg.address or address_of(self.cfg.node_name)
        self.node = self.cfg.node_name
        self.jobs, self.nodes, self.bus = jobs, nodes, bus
        self.retention = RetentionStore(jobs.redis, jobs.keys)
        self.tenants, self.uids = TenantStore(jobs.redis, jobs.keys), JobUids(jobs.redis, jobs.keys)
        self.blobs = BlobStore(connect_binary(settings), jobs.keys, settings.workdir_retention_s)
        self.inventory, self.runtime, self.supervisor, self.clock = inventory, runtime, supervisor, clock
        self.policy = RetryPolicy(
            settings.retry_backoff_s, settings.retry_backoff_max_s, settings.max_infra_requeues
        )
        self.agent_id = _agent_id(self.cfg.state_dir)
        self._lock = threading.Lock()
        self._busy: set[tuple[str, int]] = set()  # attempts being launched or finished right now
        self._stopping: set[tuple[str, int]] = set()  # attempts being stopped (a Stop, or reconcile)
        self._timed_out: set[tuple[str, int]] = set()  # attempts stopped at their time limit
        self._prepare_failures = 0  # attempts in a row this node could not prepare
        self.renewed_at = 0.0  # wall clock of the last renewal (heartbeat lag metric)
        #: pids of fleet's own processes, refreshed by reconcile: the heartbeat never waits on Docker
        self._fleet_pids: set[int] = set()
        self.stop_event = threading.Event()
        self.logs = LogShipper(
            runtime, jobs, settings.log_max_lines, self.cfg.log_ship_interval_s, self.stop_event,
            max_line_bytes=settings.log_max_line_bytes, max_bytes=settings.log_max_bytes,
        )  # fmt: skip
        self._health = StepHealth(log)
        self.notifier = Notifier()

    # -- main loop -------------------------------------------------------------------

    def run(self) -> None:
        """The heartbeat loop runs here and waits on nothing but Redis and the local supervisor;
        launches (image pulls), exits and reconcile run on other threads."""
        jobs_as = f"job_user {self.cfg.job_user}" if self.cfg.job_user else f"uids {self.cfg.job_uid_range}"
        event(log, "agent_start", node=self.node, runtime=self.runtime.name, gpus=self.inventory.backend,
              redis=self.settings.redis_display, version=VERSION, jobs_as=jobs_as)  # fmt: skip
        self.clean_workdir_temp()
        self.supervisor.ensure()
        self.heartbeat()
        metrics.serve(
            metrics.agent_registry(self, self.clock), self.cfg.metrics_port, self.cfg.metrics_address, log
        )
        queue = node_queue(self.node)
        self.bus.handle(queue, Launch, self.on_launch)
        self.bus.handle(queue, Stop, self.on_stop)
        worker = self.bus.worker(queue, self.cfg.worker_threads)
        self.logs.start()
        self.runtime.watch(self.on_exit, self.stop_event)
        reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        reconciler.start()
        sweeper = threading.Thread(target=self._sweep_loop, name="checkpoint-sweep", daemon=True)
        sweeper.start()
        self.notifier.ready(
            f"node {self.node}: {len(self.inventory.gpus())} GPUs, {self.runtime.name} runtime"
        )
        try:
            while not self.stop_event.is_set():
                self.notifier.watchdog()
                self._guarded(self.heartbeat)
                self.stop_event.wait(self.cfg.heartbeat_interval_s)
        finally:
            self.notifier.stopping()
            worker.stop(timeout=2000)
            reconciler.join(timeout=10)
            sweeper.join(timeout=10)
            self.logs.close()
            if self.cfg.stop_jobs_on_exit:
                self._stop_all()
                self.supervisor.shutdown()
            self.runtime.close()
            event(log, "agent_stop", node=self.node)

    def _reconcile_loop(self) -> None:
        self._guarded(self.reconcile)  # at once: a restarted agent reattaches what runs on its node
        while not self.stop_event.wait(self.cfg.reconcile_interval_s):
            self._guarded(self.reconcile)

    def _sweep_loop(self) -> None:
        while not self.stop_event.wait(self.cfg.checkpoint_sweep_interval_s):
            self._guarded(self.sweep_checkpoints)

    def sweep_checkpoints(self) -> list[str]:
        """Remove the checkpoint directories of jobs retention deleted (see sweep.py)."""
        return sweep(self.settings.checkpoint_root, self.retention, log)

    def clean_workdir_temp(self) -> None:
        """Remove the temporary directories of unpacks a crash cut short (before any attempt unpacks)."""
        folder = self.cfg.state_dir / "workdirs"
        try:
            checkpoints.traversable(folder)  # and private, where an older release left it 0755
            removed = clean_temp(folder)
        except OSError as exc:  # the first unpack that needs it says so, and counts against the node
            event(log, "workdir_temp_not_cleaned", logging.WARNING, node=self.node, dir=folder, error=exc)
            return
        if removed:
            event(log, "workdir_temp_cleaned", node=self.node, dir=folder, removed=len(removed),
                  names=",".join(removed))  # fmt: skip

    def _guarded(self, step: Callable[[], object]) -> None:
        self._health.guard(step, node=self.node)

    def heartbeat(self) -> None:
        gpus = self.inventory.gpus()
        fleet_pids = self._fleet_pids
        gpus = [
            g.model_copy(update={"busy": busy_reason(g, fleet_pids, self.cfg.gpu_busy_memory)}) for g in gpus
        ]
        info = NodeInfo(
            gpus=gpus, cpus=self.cfg.cpus or os.cpu_count() or 0,
            memory=self.cfg.memory or psutil.virtual_memory().total,
            runtime=self.runtime.name, gpu_backend=self.inventory.backend, address=self.address,
            labels=self.cfg.labels,
        )  # fmt: skip
        sent = time.monotonic()  # the lease runs from no later than this
        joined = self.nodes.heartbeat(self.node, self.agent_id, self.cfg.node_lease_ttl_s, self.clock(), info)
        self.renewed_at = self.clock()
        if joined:
            event(log, "node_joined", node=self.node, gpus=len(gpus))
            self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=self.node))
        self._confirm_lease(sent + self.cfg.node_lease_ttl_s)

    def _confirm_lease(self, until: float) -> None:
        """Tell the supervisor how long the lease holds; it stops every attempt before then."""
        try:
            self.supervisor.lease(until)
        except OSError as exc:
            raise LaunchError(f"node supervisor unreachable: {exc}", retryable=True) from exc

    # -- launch ----------------------------------------------------------------------

    def on_launch(self, msg: Launch) -> None:
        self.launch(msg.job_id, msg.attempt)

    def launch(self, job_id: str, attempt: int) -> None:
        if not self._claim(job_id, attempt):
            return
        try:
            self._launch(job_id, attempt)
        finally:
            self._release(job_id, attempt)

    def _launch(self, job_id: str, attempt: int) -> None:
        try:
            job = self.jobs.get(job_id)
        except NotFound:
            event(log, "launch_ignored", job=job_id, attempt=attempt, why="no such job")
            return
        rank, gang = job.rank_on(self.node), len(job.members) > 1
        # a multi-node job is STARTING once its first member starts; the others start from there
        launchable = (JobState.SCHEDULED, JobState.STARTING) if gang else (JobState.SCHEDULED,)
        if rank is None or job.attempt != attempt or job.state not in launchable:
            where = ",".join(job.nodes_held) or "-"
            event(log, "launch_ignored", job=job_id, attempt=attempt,
                  why=f"job is {job.state} attempt {job.attempt} on {where}")  # fmt: skip
            return
        if gang and self.jobs.member(job, rank, "starting") < 0:
            event(log, "launch_ignored", job=job_id, attempt=attempt, why=f"member {rank} started already")
            return
        started = self.jobs.transition(
            job_id, attempt=attempt, allowed=launchable, to=JobState.STARTING, now=self.clock(),
            reason=f"starting on {self.node}" + (f" (member {rank} of {len(job.members)})" if gang else ""),
        )  # fmt: skip
        if not started:
            return
        if job.cancel_requested:
            self._finish(job, Exit(fault=CANCEL, reason="cancelled before start"))
            return
        try:
            gpus = job.gpus_on(self.node)
            check_assigned(self.inventory, self.runtime, gpus, self.node, self.cfg.gpu_busy_memory)
            self.runtime.start(self._spec(job, rank))
        except (LaunchError, SpecError, OSError) as exc:
            self._launch_failed(job, exc)
            return
        with self._lock:
            self._prepare_failures = 0
        if not self._running(job, rank):
            # the controller gave up on this launch meanwhile (start deadline, cancel): its GPUs may
            # already be someone else's, so the attempt must not run on
            event(log, "stale_launch_stopped", job=job_id, attempt=attempt)
            self.runtime.stop(job_id, attempt, 0)
            self._remove(job_id, attempt)
            return
        self.logs.follow(job_id, attempt, rank)
        event(log, "attempt_started", job=job_id, attempt=attempt, node=self.node, rank=rank,
              gpus=",".join(job.gpus_on(self.node)) or "-")  # fmt: skip
        self.bus.send(
            CONTROLLER_QUEUE, AttemptUpdate(job_id=job_id, attempt=attempt, node=self.node, phase="started")
        )

    def _launch_failed(self, job: Job, exc: LaunchError | SpecError | OSError) -> None:
        """End an attempt that could not start: the job's fault (a spec this node refuses) fails it;
        the node's (a GPU busy, a workdir it cannot write) requeues it and counts against the node."""
        if isinstance(exc, OSError):
            exc = LaunchError(f"cannot prepare the attempt on {self.node}: {exc}", retryable=True)
        retryable = isinstance(exc, LaunchError) and exc.retryable
        kind = "gpu_busy" if isinstance(exc, GpuBusy) else "prepare" if retryable else ""
        self._finish(job, Exit(reason=str(exc), fault=INFRA if retryable else FATAL, kind=kind))
        if isinstance(exc, GpuBusy):
            self._guarded(self.heartbeat)  # publish the busy GPU before the job is placed again
        elif retryable:
            self._prepare_failed(str(exc))

    def _prepare_failed(self, why: str) -> None:
        """Count an attempt this node could not prepare (the node's fault, not the job's); after
        ``max_prepare_failures`` in a row the node cordons itself with the reason, so no more jobs
        are placed on it until an operator has fixed it and uncordons it. Its running jobs go on."""
        limit = self.cfg.max_prepare_failures
        with self._lock:
            self._prepare_failures += 1
            failures = self._prepare_failures
            if not limit or failures < limit:
                return
            self._prepare_failures = 0
        reason = (f"quarantined: {failures} attempts in a row could not be prepared on this node (last: "
                  f"{why[:300]}); fix the node, then `fleet nodes uncordon {self.node}`")  # fmt: skip
        try:
            cordoned = self.nodes.set_state(self.node, NodeState.CORDONED, reason, self.clock(),
                                            f"agent {self.node}", only_from=[NodeState.READY])  # fmt: skip
        except FleetError as exc:
            event(log, "node_quarantine_failed", logging.WARNING, node=self.node, error=exc)
            return
        if cordoned:
            event(log, "node_quarantined", logging.WARNING, node=self.node, failures=failures, reason=why)

    def _running(self, job: Job, rank: int) -> bool:
        """The attempt runs here: the job is RUNNING (a multi-node job once every member runs);
        False when the launch went stale meanwhile."""
        if len(job.members) > 1:
            running = self.jobs.member(job, rank, "running")
            if running < 0:
                return False
            if running < len(job.members):
                return True  # the last member to run moves the job to RUNNING
        where = f"{len(job.members)} nodes" if len(job.members) > 1 else self.node
        return self.jobs.transition(
            job.id, attempt=job.attempt, allowed=[JobState.STARTING], to=JobState.RUNNING,
            reason=f"running on {where}", now=self.clock(), fields={"started_at": self.clock()},
        )  # fmt: skip

    def _spec(self, job: Job, rank: int = 0) -> LaunchSpec:
        spec = job.spec
        mounts = check_mounts(spec.mounts, self.settings.allowed_mounts)
        image = spec.image or self.settings.default_image
        check_image(image, self.settings.allowed_registries)
        user = self._job_user(spec)
        uid, gid = user if user else (None, None)
        ckpt = checkpoints.prepare(self.settings.checkpoint_root, job.id, job.attempt, uid, gid)
        gpus = tuple(job.gpus_on(self.node))
        cpus, memory = job_limits(spec.cpus, spec.memory, len(gpus), self.cfg, self._capacity())
        return LaunchSpec(
            job_id=job.id, attempt=job.attempt, image=image,
            command=tuple(spec.command), env=dict(spec.env), gpus=gpus,
            gpu_devices=self.inventory.backend == "nvml", cpus=cpus, memory=memory,
            shm_size=spec.shm_size or self.cfg.default_shm_size, mounts=tuple(mounts), checkpoint_dir=ckpt,
            resume_from=checkpoints.latest(ckpt), user=user, pids_limit=self.cfg.pids_limit,
            array_index=job.array_index, rank=rank, members=max(len(job.members), 1),
            master_addr=job.master_addr, master_port=job.master_port, workdir=self._workdir(job),
            batch_size=job.global_batch,
        )  # fmt: skip

    def _job_user(self, spec: JobSpec) -> tuple[int, int] | None:
        """Who the job runs as (``job_user``); its ``user`` checked against its tenant's record
        again here, since the record may have changed since the job was submitted."""
        requested = self.tenants.policy(spec.tenant).check_user(spec.user) if spec.user else None
        return job_user(requested, self.cfg, lambda: self.uids.uid(spec.tenant, self.cfg.uid_range))

    def _capacity(self) -> tuple[float, int, int]:
        """What this node offers jobs, CPUs, memory and GPUs: never more CPUs or memory than the
        machine has (a limit past them is meaningless, and Docker refuses CPUs it does not have)."""
        cpus, memory = os.cpu_count() or 1, psutil.virtual_memory().total
        offered = min(self.cfg.cpus or cpus, cpus), min(self.cfg.memory or memory, memory)
        return *offered, len(self.inventory.gpus())

    def _workdir(self, job: Job) -> Path | None:
        """The job's shipped directory, unpacked once per node (content-addressed, read-only)."""
        digest = job.spec.workdir
        if digest is None:
            return None
        folder = self.cfg.state_dir / "workdirs"
        unpacked = folder / check_digest(digest)
        if unpacked.is_dir():  # another attempt here unpacked it: no need to fetch it again
            return unpacked
        # 0711: a job reaches the tree it was given (read-only, its own digest) but cannot list the
        # digests of other tenants' trees
        checkpoints.traversable(folder)
        data = self.blobs.get(digest)
        if data is None:
            raise LaunchError(f"workdir {digest} is no longer stored (kept workdir_retention_s after its "
                              "last upload or submit): submit the job again", retryable=False)  # fmt: skip
        return unpack(data, digest, folder, max(self.settings.workdir_max_bytes, MAX_BYTES))

    # -- stop and exit ---------------------------------------------------------------

    def on_stop(self, msg: Stop) -> None:
        event(log, "attempt_stop", job=msg.job_id, attempt=msg.attempt, reason=msg.reason)
        # a stop under way: reconcile must not stop it again with stop_grace_s, which would cut short
        # the grace this one gave (a preemption's or a resize's, to checkpoint in)
        key = (msg.job_id, msg.attempt)
        self._stopping.add(key)
        try:
            self.runtime.stop(msg.job_id, msg.attempt, msg.grace_s)  # returns once it no longer runs
        finally:
            self._stopping.discard(key)

    def on_exit(self, job_id: str, attempt: int) -> None:
        """Runtime callback (its own thread); on a Redis error the next reconcile finishes the attempt."""
        try:
            status = next(
                (a for a in self.runtime.attempts() if (a.job_id, a.attempt) == (job_id, attempt)), None
            )
            if status is not None and status.exit is not None:
                self.finish(job_id, attempt, status.exit)
        except FleetError as exc:
            event(log, "exit_not_recorded", logging.WARNING, job=job_id, attempt=attempt, error=exc)

    def finish(self, job_id: str, attempt: int, exit: Exit) -> None:
        fenced = self.supervisor.fenced(f"{job_id}.{attempt}")
        if fenced is not None:
            exit = Exit(code=exit.code, fault=INFRA, kind="fenced",
                        reason=f"stopped by node {self.node}'s supervisor: {fenced}")  # fmt: skip
        if not self._claim(job_id, attempt):
            return
        try:
            job = self.jobs.get(job_id)
            if job.attempt == attempt and job.state in (JobState.STARTING, JobState.RUNNING):
                self._finish(job, exit)
            else:
                self._remove(job_id, attempt)
        except NotFound:
            self._remove(job_id, attempt)
        finally:
            self._release(job_id, attempt)
        self._stopping.discard((job_id, attempt))  # only once recorded: an error above keeps it

    def _finish(self, job: Job, exit: Exit) -> None:
        """Ship the last logs, record how the attempt ended, remove it, then end it in the store.

        The last logs are read before the removal deletes the attempt's output. The end is recorded
        before the removal, so a Redis error in between cannot make a finished attempt look lost
        (and run a SUCCEEDED job again). The claims are released only once the container is gone,
        so a GPU is never handed to the next job while a process of this one may still hold it.
        """
        if not self.logs.finish(job.id, job.attempt, timeout=10, rank=job.rank_on(self.node) or 0):
            event(log, "last_logs_not_shipped", logging.WARNING, job=job.id, attempt=job.attempt)
        exit = self._ended_by_time_limit(job, self._explained(job, exit))
        if job.preempt and not job.cancel_requested and not (exit.code == 0 and exit.fault == JOB):
            kind = RESIZE if job.resize_gpus is not None else "preempted" if job.preempted_for else "drain"
            why = f"{job.preempt}: {exit.reason}"
            exit = Exit(code=exit.code, oom=exit.oom, fault=INFRA, kind=kind, reason=why)
        self.jobs.record_exit(job, exit, self.clock())
        self.runtime.remove(job.id, job.attempt)
        self._await_gpus_released(job)
        rank, gang = job.rank_on(self.node) or 0, len(job.members) > 1
        if gang and exit.code == 0 and exit.fault == JOB:
            done = self.jobs.member(job, rank, "done")
            if done < len(job.members):  # the others still run (or this one was counted already)
                event(log, "member_done", job=job.id, attempt=job.attempt, rank=rank, members_done=done)
                return
        elif gang:
            wait_s = self.cfg.node_lease_ttl_s + self.cfg.heartbeat_interval_s
            exit = member_failed(self.jobs, self.nodes, job, self.node, exit, wait_s, self.stop_event)
        decision = self.jobs.end_attempt(
            job, exit, self.policy, self.clock(), {"checkpoint": self._latest(job)}
        )
        if decision is None:
            return
        if gang:  # one member's end is the attempt's: stop the others now, not at a collective's timeout
            stop = Stop(
                job_id=job.id, attempt=job.attempt, reason=decision.reason, grace_s=self.cfg.stop_grace_s
            )
            for node in set(job.nodes_held) - {self.node}:
                self.bus.send(node_queue(node), stop)
        event(log, "attempt_exited", job=job.id, attempt=job.attempt, code=exit.code,
              state=decision.state, reason=decision.reason)  # fmt: skip
        self.bus.send(
            CONTROLLER_QUEUE,
            AttemptUpdate(job_id=job.id, attempt=job.attempt, node=self.node, phase="exited",
                          exit_code=exit.code, oom=exit.oom, reason=exit.reason),
        )  # fmt: skip

    def _explained(self, job: Job, exit: Exit) -> Exit:
        """A program that never ran (python's "can't open file", exit 2) fails at once, not after
        spending its retries: read from the attempt's last lines, shipped just before."""
        if exit.code != 2 or exit.fault != JOB:
            return exit  # only a candidate costs a read
        tail = self.jobs.log_tail(job.id, job.attempt, TAIL_LINES, job.rank_on(self.node) or 0)
        return explain(exit, tail)

    def _latest(self, job: Job) -> str | None:
        try:
            return checkpoints.latest(checkpoints.job_dir(self.settings.checkpoint_root, job.id))
        except SpecError:  # an id that cannot be a path has no checkpoints
            return None

    def _await_gpus_released(self, job: Job) -> None:
        """Claims are released either way, but a GPU still holding a process is reported and
        published as busy by every heartbeat, so the scheduler does not hand it to the next job."""
        gpus = job.gpus_on(self.node)
        stuck = await_released(self.inventory, self.runtime, gpus, self.cfg.gpu_release_timeout_s)
        if stuck:
            event(log, "gpu_not_released", logging.WARNING, job=job.id, attempt=job.attempt,
                  gpus=";".join(f"{u}:{','.join(map(str, p))}" for u, p in stuck.items()))  # fmt: skip
            self._guarded(self.heartbeat)

    # -- reconcile -------------------------------------------------------------------

    def reconcile(self) -> None:
        """Make the node match state: finish exited attempts, kill stale ones, launch lost launches."""
        # in this order: a launch running while the node's jobs are read is still busy when busy is
        # read, or already held when the runtime is listed, so it never looks lost
        on_node = self.jobs.on_node(self.node)
        with self._lock:
            busy = set(self._busy)
        held = self.runtime.attempts()
        self._fleet_pids = self.runtime.pids()
        jobs = {j.id: j for j in self.jobs.get_many({a.job_id for a in held})}
        self._enforce_time_limits(held, jobs)
        todo = plan.reconcile(self.node, held, jobs, on_node, busy, self.logs.following())
        for status in todo.stale:
            event(log, "stale_attempt_killed", job=status.job_id, attempt=status.attempt)
            self.runtime.stop(status.job_id, status.attempt, 0)
            self._remove(status.job_id, status.attempt)
        for status in todo.stop:
            self._stop_in_background(status.job_id, status.attempt)
        for status in todo.reattach:
            event(log, "attempt_reattached", job=status.job_id, attempt=status.attempt)
            self.runtime.supervise(status.job_id, status.attempt)
            job = jobs.get(status.job_id)
            self.logs.follow(status.job_id, status.attempt, (job.rank_on(self.node) or 0) if job else 0)
        for status in todo.finish:
            assert status.exit is not None
            self.finish(status.job_id, status.attempt, status.exit)
        for job in todo.launch:
            self.launch(job.id, job.attempt)
        for job in todo.lost:
            self._lost(job)

    def _enforce_time_limits(self, held: list[AttemptStatus], jobs: dict[str, Job]) -> None:
        """Stop each running attempt at its limit: SIGTERM ``signal_before`` ahead of it (the grace
        to checkpoint in), SIGKILL at it. Checked each reconcile (``reconcile_interval_s``)."""
        now = self.clock()
        for status in held:
            job, key = jobs.get(status.job_id), (status.job_id, status.attempt)
            if job is None or job.attempt != status.attempt or job.state != JobState.RUNNING:
                continue
            deadline = time_limit(job)
            if not status.running or deadline is None or now < deadline or key in self._timed_out:
                continue
            self._timed_out.add(key)
            grace = job.spec.signal_before or self.cfg.stop_grace_s
            event(log, "time_limit", job=job.id, attempt=job.attempt, timeout=job.spec.timeout, grace_s=grace)
            threading.Thread(target=self.runtime.stop, args=(*key, grace), daemon=True).start()

    def _ended_by_time_limit(self, job: Job, exit: Exit) -> Exit:
        """The exit as a time limit's when the attempt was stopped at it (or, after an agent restart,
        ended past it other than by succeeding): FAILED, or requeued if the job asked to be."""
        key = (job.id, job.attempt)
        deadline = time_limit(job)
        stopped = key in self._timed_out
        self._timed_out.discard(key)
        past = (
            deadline is not None and self.clock() >= deadline and not (exit.code == 0 and exit.fault == JOB)
        )
        if job.cancel_requested or job.preempt or not (stopped or past) or exit.fault != JOB:
            return exit
        limit = f"time limit of {job.spec.timeout:g}s reached: {exit.reason}"
        fault = INFRA if job.spec.requeue_on_timeout else FATAL
        return Exit(code=exit.code, oom=exit.oom, fault=fault, kind="timeout", reason=limit)

    def _lost(self, job: Job) -> None:
        """An attempt Redis places here that the runtime does not hold: use the end recorded
        before its removal if there is one, else it vanished (not the job's fault)."""
        if not self._claim(job.id, job.attempt):
            return
        try:
            if any((a.job_id, a.attempt) == (job.id, job.attempt) for a in self.runtime.attempts()):
                return  # it started after the reconcile looked
            try:
                now = self.jobs.get(job.id)
            except NotFound:
                return
            if not plan.still_lost(self.node, job, now):
                return  # it ended after the reconcile looked (a member done, or its exit recorded)
            job = now
            # a multi-node job keeps one recorded exit for all its members: not this member's
            recorded = job.last_exit_attempt == job.attempt and len(job.members) <= 1
            exit = job.last_exit if recorded else None
            self._finish(job, exit or Exit(code=None, fault=INFRA, kind="lost",
                                           reason=f"attempt vanished from node {self.node}"))  # fmt: skip
        finally:
            self._release(job.id, job.attempt)

    # -- helpers ---------------------------------------------------------------------

    def _stop_in_background(self, job_id: str, attempt: int) -> None:
        """Stop an attempt whose stop message may have been lost, without holding up reconcile."""
        if (job_id, attempt) in self._stopping:
            return
        self._stopping.add((job_id, attempt))
        threading.Thread(
            target=self.runtime.stop, args=(job_id, attempt, self.cfg.stop_grace_s), daemon=True
        ).start()

    def _remove(self, job_id: str, attempt: int) -> None:
        """Remove an attempt whose output is not shipped any further (stale, or its job is gone)."""
        self.logs.forget(job_id, attempt)
        self.runtime.remove(job_id, attempt)

    def _claim(self, job_id: str, attempt: int) -> bool:
        with self._lock:
            if (job_id, attempt) in self._busy:
                return False
            self._busy.add((job_id, attempt))
            return True

    def _release(self, job_id: str, attempt: int) -> None:
        with self._lock:
            self._busy.discard((job_id, attempt))

    def _stop_all(self) -> None:
        for status in self.runtime.attempts():
            if status.running:
                self.runtime.stop(status.job_id, status.attempt, self.cfg.stop_grace_s)
            self._remove(status.job_id, status.attempt)


def time_limit(job: Job) -> float | None:
    """When the running attempt gets SIGTERM for its time limit; None without a limit."""
    if job.spec.timeout is None or job.started_at is None:
        return None
    return job.started_at + job.spec.timeout - (job.spec.signal_before or 0.0)


def job_user(
    requested: tuple[int, int] | None, cfg: AgentSettings, tenant_uid: Callable[[], int]
) -> tuple[int, int] | None:
    """(uid, gid) a job runs as: its spec's ``user`` (``requested``, allow-listed for its tenant),
    else the node's fixed ``job_user``, else its tenant's own uid (``tenant_uid``, the same number as
    gid). Root only where the operator allows it. An agent that is not root cannot
    switch users: None (its own), and a job that asked for another user is refused."""
    if requested is not None and requested[0] == 0 and not cfg.allow_root_jobs:
        raise SpecError(f"user: jobs may not run as root (uid 0) on node {cfg.node_name}; drop `user` to "
                        "run as the tenant's own uid, or ask an operator to set allow_root_jobs")  # fmt: skip
    fixed = cfg.fixed_user  # root only with allow_root_jobs (checked with the config)
    if os.geteuid() != 0:
        if requested is not None and requested[0] != os.geteuid():
            raise SpecError(f"user: node {cfg.node_name}'s agent is not root and runs jobs as uid "
                            f"{os.geteuid()} only; drop `user`")  # fmt: skip
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


def address_of(name: str) -> str:
    """What the node name resolves to (a multi-node job's MASTER_ADDR when this node holds rank 0)."""
    for host in (name, socket.gethostname()):
        try:
            return socket.gethostbyname(host)
        except OSError:
            continue
    return "127.0.0.1"  # multi-node jobs then only meet on this machine: set agent.address


def _agent_id(state_dir: Path) -> str:
    """A stable id per machine and state dir, so a restarted agent keeps its own node lease. The
    state dir is 0711: jobs pass through it to their own folders, and only the agent lists it."""
    checkpoints.traversable(state_dir)
    path = state_dir / "agent-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        agent_id = uuid.uuid4().hex[:12]
        path.write_text(agent_id)
        return agent_id
