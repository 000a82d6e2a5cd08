"""The node agent: heartbeats its lease, launches what the controller assigned, reports exits.

It never decides placement. Messages make it act now; ``reconcile`` makes the same decisions
from Redis state and the runtime's own list of attempts, so a lost or duplicated message
changes nothing, and a restarted agent reattaches to the attempts still running.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from fleet import checkpoints, metrics
from fleet.agent.gpucheck import await_released, check_assigned
from fleet.agent.gpus import GpuInventory, busy_reason
from fleet.agent.logship import LogShipper
from fleet.agent.runtime import AttemptStatus, LaunchSpec, Runtime
from fleet.bus import CONTROLLER_QUEUE, AttemptUpdate, Bus, Launch, NodeChanged, Stop, node_queue
from fleet.config import Settings
from fleet.errors import FleetError, GpuBusy, LaunchError, NotFound, SpecError
from fleet.lifecycle import CANCEL, FATAL, INFRA, JOB, RetryPolicy, decide
from fleet.log import StepHealth, event
from fleet.models import Exit, Job, JobState
from fleet.mounts import check_mounts
from fleet.sdnotify import Notifier
from fleet.state import JobStore, NodeStore
from fleet.state.nodes import NodeInfo

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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.cfg = settings, settings.agent
        self.node = self.cfg.node_name
        self.jobs, self.nodes, self.bus = jobs, nodes, bus
        self.inventory, self.runtime, self.clock = inventory, runtime, clock
        self.policy = RetryPolicy(
            settings.retry_backoff_s, settings.retry_backoff_max_s, settings.max_infra_requeues
        )
        self.agent_id = _agent_id(self.cfg.state_dir)
        self._lock = threading.Lock()
        self._busy: set[tuple[str, int]] = set()  # attempts being launched or finished right now
        self._shippers: dict[tuple[str, int], LogShipper] = {}
        #: attempts this agent stopped because it lost its lease: their exit is not the job's fault
        self._fenced: set[tuple[str, int]] = set()
        self._stopping: set[tuple[str, int]] = set()  # attempts stopped by reconcile, in a thread
        self._renewed = time.monotonic()
        self.renewed_at = 0.0  # wall clock of the last renewal (heartbeat lag metric)
        self.stop_event = threading.Event()
        self._health = StepHealth(log)
        self.notifier = Notifier()

    # -- main loop -------------------------------------------------------------------

    def run(self) -> None:
        event(log, "agent_start", node=self.node, runtime=self.runtime.name, gpus=self.inventory.backend,
              redis=self.settings.redis_display)  # fmt: skip
        self.heartbeat()
        metrics.serve(metrics.agent_registry(self, self.clock), self.cfg.metrics_port, log)
        queue = node_queue(self.node)
        self.bus.handle(queue, Launch, self.on_launch)
        self.bus.handle(queue, Stop, self.on_stop)
        worker = self.bus.worker(queue, self.cfg.worker_threads)
        self.runtime.watch(self.on_exit, self.stop_event)
        threading.Thread(target=self._fence_watchdog, name="fence-watchdog", daemon=True).start()
        next_reconcile = 0.0
        self.notifier.ready(
            f"node {self.node}: {len(self.inventory.gpus())} GPUs, {self.runtime.name} runtime"
        )
        try:
            while not self.stop_event.is_set():
                self.notifier.watchdog()
                self._guarded(self.heartbeat)
                if time.monotonic() >= next_reconcile:
                    self._guarded(self.reconcile)
                    next_reconcile = time.monotonic() + self.cfg.reconcile_interval_s
                self.stop_event.wait(self.cfg.heartbeat_interval_s)
        finally:
            self.notifier.stopping()
            worker.stop(timeout=2000)
            if self.cfg.stop_jobs_on_exit:
                self._stop_all()
            self.runtime.close()
            event(log, "agent_stop", node=self.node)

    def _guarded(self, step: Callable[[], object]) -> None:
        self._health.guard(step, node=self.node)

    def heartbeat(self) -> None:
        gpus = self.inventory.gpus()
        fleet_pids = self.runtime.pids() if any(g.processes for g in gpus) else set()
        gpus = [
            g.model_copy(update={"busy": busy_reason(g, fleet_pids, self.cfg.gpu_busy_memory)}) for g in gpus
        ]
        info = NodeInfo(
            gpus=gpus, cpus=os.cpu_count() or 0, memory=psutil.virtual_memory().total,
            runtime=self.runtime.name, gpu_backend=self.inventory.backend,
        )  # fmt: skip
        joined = self.nodes.heartbeat(self.node, self.agent_id, self.cfg.node_lease_ttl_s, self.clock(), info)
        self._renewed, self.renewed_at = time.monotonic(), self.clock()
        if joined:
            event(log, "node_joined", node=self.node, gpus=len(gpus))
            self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=self.node))

    def _fence_watchdog(self) -> None:
        """Apart from the heartbeat loop, which may hang in a socket when the network blackholes."""
        while not self.stop_event.wait(self.cfg.heartbeat_interval_s / 2):
            self._guarded(self._fence_if_lease_lost)

    def _fence_if_lease_lost(self) -> None:
        """Stop every attempt before the lease can expire unrenewed (two heartbeats of margin).

        The controller requeues the jobs of a node whose lease expired; an agent that cannot
        reach Redis must not keep running them, or a partitioned node would run a job that also
        runs elsewhere.
        """
        margin = 2 * self.cfg.heartbeat_interval_s
        if time.monotonic() - self._renewed < self.cfg.node_lease_ttl_s - margin:
            return
        running = [a for a in self.runtime.attempts() if a.running]
        for status in running:
            self._fenced.add((status.job_id, status.attempt))
            self.runtime.stop(status.job_id, status.attempt, 0)
        if running:
            event(log, "self_fenced", logging.WARNING, node=self.node, stopped=len(running),
                  why=f"lease not renewed for {time.monotonic() - self._renewed:.1f}s")  # fmt: skip

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
        if job.node != self.node or job.attempt != attempt or job.state != JobState.SCHEDULED:
            event(
                log,
                "launch_ignored",
                job=job_id,
                attempt=attempt,
                why=f"job is {job.state} attempt {job.attempt}",
            )
            return
        started = self.jobs.transition(
            job_id, attempt=attempt, allowed=[JobState.SCHEDULED], to=JobState.STARTING,
            reason=f"starting on {self.node}", now=self.clock(),
        )  # fmt: skip
        if not started:
            return
        if job.cancel_requested:
            self._finish(job, Exit(fault=CANCEL, reason="cancelled before start"))
            return
        try:
            check_assigned(self.inventory, self.runtime, job.gpus, self.node, self.cfg.gpu_busy_memory)
            self.runtime.start(self._spec(job))
        except (LaunchError, SpecError) as exc:
            retryable = isinstance(exc, LaunchError) and exc.retryable
            kind = "gpu_busy" if isinstance(exc, GpuBusy) else ""
            self._finish(job, Exit(reason=str(exc), fault=INFRA if retryable else FATAL, kind=kind))
            if isinstance(exc, GpuBusy):
                self._guarded(self.heartbeat)  # publish the busy GPU before the job is placed again
            return
        self._ship(job_id, attempt)
        self.jobs.transition(
            job_id, attempt=attempt, allowed=[JobState.STARTING], to=JobState.RUNNING,
            reason=f"running on {self.node}", now=self.clock(), fields={"started_at": self.clock()},
        )  # fmt: skip
        event(
            log,
            "attempt_started",
            job=job_id,
            attempt=attempt,
            node=self.node,
            gpus=",".join(job.gpus) or "-",
        )
        self.bus.send(
            CONTROLLER_QUEUE, AttemptUpdate(job_id=job_id, attempt=attempt, node=self.node, phase="started")
        )

    def _spec(self, job: Job) -> LaunchSpec:
        spec = job.spec
        check_mounts(spec.mounts, self.settings.allowed_mounts)
        ckpt = checkpoints.job_dir(self.settings.checkpoint_root, job.id)
        ckpt.mkdir(parents=True, exist_ok=True)
        ckpt.chmod(0o777)  # the job's container user may not be root
        return LaunchSpec(
            job_id=job.id, attempt=job.attempt, image=spec.image or self.settings.default_image,
            command=tuple(spec.command), env=dict(spec.env), gpus=tuple(job.gpus),
            gpu_devices=self.inventory.backend == "nvml", cpus=spec.cpus, memory=spec.memory,
            shm_size=spec.shm_size, mounts=tuple(spec.mounts), checkpoint_dir=ckpt,
            resume_from=checkpoints.latest(ckpt),
        )  # fmt: skip

    # -- stop and exit ---------------------------------------------------------------

    def on_stop(self, msg: Stop) -> None:
        event(log, "attempt_stop", job=msg.job_id, attempt=msg.attempt, reason=msg.reason)
        self.runtime.stop(msg.job_id, msg.attempt, msg.grace_s)

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
        if (job_id, attempt) in self._fenced:
            exit = Exit(
                code=exit.code,
                fault=INFRA,
                kind="fenced",
                reason=f"stopped by node {self.node}: it lost its lease",
            )
        if not self._claim(job_id, attempt):
            return
        try:
            job = self.jobs.get(job_id)
            if job.attempt == attempt and job.state in (JobState.STARTING, JobState.RUNNING):
                self._finish(job, exit)
            else:
                self.runtime.remove(job_id, attempt)
        except NotFound:
            self.runtime.remove(job_id, attempt)
        finally:
            self._release(job_id, attempt)
        # only once recorded: a Redis error above keeps them for the next try
        self._fenced.discard((job_id, attempt))
        self._stopping.discard((job_id, attempt))

    def _finish(self, job: Job, exit: Exit) -> None:
        """Ship the last logs, remove the attempt, then record how it ended and free its GPUs.

        The claims are released only once the container is gone, so a GPU is never handed to the
        next job while a process of this one may still hold it.
        """
        shipper = self._shippers.pop((job.id, job.attempt), None)
        if shipper is not None:
            shipper.join(timeout=10)
        self.runtime.remove(job.id, job.attempt)
        self._await_gpus_released(job)
        if job.preempt and not job.cancel_requested and not (exit.code == 0 and exit.fault == JOB):
            exit = Exit(
                code=exit.code,
                oom=exit.oom,
                fault=INFRA,
                kind="drain",
                reason=f"{job.preempt}: {exit.reason}",
            )
        now = self.clock()
        decision = decide(job, exit, self.policy)
        ckpt = checkpoints.latest(checkpoints.job_dir(self.settings.checkpoint_root, job.id))
        fields = {
            "exit_code": exit.code, "checkpoint": ckpt, "not_before": now + decision.delay, "preempt": "",
            "finished_at": now if decision.state.final else None,
        }  # fmt: skip
        applied = self.jobs.transition(
            job.id, attempt=job.attempt, allowed=[JobState.STARTING, JobState.RUNNING], to=decision.state,
            reason=decision.reason, now=now, fields=fields, incr=decision.incr, release=True,
        )  # fmt: skip
        if applied and decision.state == JobState.QUEUED:
            self.jobs.count_requeue(exit.kind or ("job_failure" if exit.fault == JOB else "infrastructure"))
        if applied:
            event(
                log, "attempt_exited", job=job.id, attempt=job.attempt, code=exit.code,
                state=decision.state, reason=decision.reason,
            )  # fmt: skip
            self.bus.send(
                CONTROLLER_QUEUE,
                AttemptUpdate(job_id=job.id, attempt=job.attempt, node=self.node, phase="exited",
                              exit_code=exit.code, oom=exit.oom, reason=exit.reason),
            )  # fmt: skip

    def _await_gpus_released(self, job: Job) -> None:
        """Claims are released either way, but a GPU still holding a process is reported and
        published as busy by every heartbeat, so the scheduler does not hand it to the next job."""
        stuck = await_released(self.inventory, self.runtime, job.gpus, self.cfg.gpu_release_timeout_s)
        if stuck:
            event(log, "gpu_not_released", logging.WARNING, job=job.id, attempt=job.attempt,
                  gpus=";".join(f"{u}:{','.join(map(str, p))}" for u, p in stuck.items()))  # fmt: skip
            self._guarded(self.heartbeat)

    # -- reconcile -------------------------------------------------------------------

    def reconcile(self) -> None:
        """Make the node match state: finish exited attempts, kill stale ones, launch lost launches."""
        held = {(a.job_id, a.attempt): a for a in self.runtime.attempts()}
        jobs = {j.id: j for j in self.jobs.get_many({job_id for job_id, _ in held})}
        for status in held.values():
            self._reconcile_attempt(status, jobs.get(status.job_id))
        for job in self.jobs.on_node(self.node):
            if (job.id, job.attempt) in held or (job.id, job.attempt) in self._busy:
                continue
            if job.state == JobState.SCHEDULED:
                self.launch(job.id, job.attempt)
            elif job.state in (JobState.STARTING, JobState.RUNNING) and self._claim(job.id, job.attempt):
                try:
                    self._finish(
                        job,
                        Exit(
                            code=None,
                            fault=INFRA,
                            kind="lost",
                            reason=f"attempt vanished from node {self.node}",
                        ),
                    )
                finally:
                    self._release(job.id, job.attempt)

    def _reconcile_attempt(self, status: AttemptStatus, job: Job | None) -> None:
        key = (status.job_id, status.attempt)
        if key in self._busy:
            return
        current = job is not None and job.attempt == status.attempt and job.node == self.node
        if status.running and not (current and job is not None and job.state.on_node):
            event(log, "stale_attempt_killed", job=status.job_id, attempt=status.attempt)
            self.runtime.stop(status.job_id, status.attempt, 0)
            self.runtime.remove(status.job_id, status.attempt)
        elif status.running and job is not None:
            if job.cancel_requested or job.preempt:
                self._stop_in_background(status.job_id, status.attempt)
            elif key not in self._shippers:
                event(log, "attempt_reattached", job=status.job_id, attempt=status.attempt)
                self._ship(status.job_id, status.attempt)
        elif status.exit is not None:
            self.finish(status.job_id, status.attempt, status.exit)

    # -- helpers ---------------------------------------------------------------------

    def _stop_in_background(self, job_id: str, attempt: int) -> None:
        """Stop an attempt whose stop message may have been lost, without holding up reconcile."""
        if (job_id, attempt) in self._stopping:
            return
        self._stopping.add((job_id, attempt))
        threading.Thread(
            target=self.runtime.stop, args=(job_id, attempt, self.cfg.stop_grace_s), daemon=True
        ).start()

    def _ship(self, job_id: str, attempt: int) -> None:
        shipper = LogShipper(
            self.runtime, self.jobs, job_id, attempt, self.settings.log_max_lines, self.stop_event
        )
        self._shippers[(job_id, attempt)] = shipper
        shipper.start()

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
            self.runtime.remove(status.job_id, status.attempt)


def _agent_id(state_dir: Path) -> str:
    """A stable id per machine and state dir, so a restarted agent keeps its own node lease."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "agent-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        agent_id = uuid.uuid4().hex[:12]
        path.write_text(agent_id)
        return agent_id
