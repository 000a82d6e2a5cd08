"""The node agent: heartbeats its lease, launches what the controller assigned, reports exits.

It never decides placement. Messages make it act now; ``reconcile`` makes the same decisions
from Redis state and the runtime's own list of attempts, so a lost or duplicated message
changes nothing, and a restarted agent reattaches to the attempts still running.

This module is the service: its threads and loops (heartbeat, messages, reconcile, checkpoint
sweep). It starts attempts through the launcher (``launcher.py``) and ends every one through the
exit path (``exits.py``); ``parts.py`` holds what the three share.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from fleet import metrics
from fleet.agent import checkpoints
from fleet.agent import reconcile as plan
from fleet.agent.exits import ExitPath
from fleet.agent.gpus import GpuInventory, busy_reason
from fleet.agent.launcher import Launcher
from fleet.agent.logship import LogShipper
from fleet.agent.parts import Parts
from fleet.agent.runtime import Runtime
from fleet.agent.runtime.base import Batched, status_of
from fleet.agent.shells import Shells
from fleet.agent.stdin import StdinPumps
from fleet.agent.supervision import SupervisorClient
from fleet.agent.sweep import sweep
from fleet.bus import CONTROLLER_QUEUE, Bus, Launch, NodeChanged, Rebatch, ShellOpen, Stop, node_queue
from fleet.bus.hints import Hints
from fleet.config import Settings
from fleet.errors import FleetError, LaunchError
from fleet.log import StepHealth, event, kv
from fleet.sdnotify import Notifier
from fleet.state import JobStore, NodeStore, Stores
from fleet.state.connection import connect_binary
from fleet.state.nodes import NodeInfo
from fleet.state.replication import confirmed
from fleet.state.shells import ShellRelay
from fleet.state.stdin import StdinStreams
from fleet.versions import VERSION
from fleet.workdir import clean_temp

log = logging.getLogger("fleet.agent")
#: an attempt that ended while another thread holds it is tried again this often, this many times
#: (about 10 s: a launch's last steps; past that the reconcile finishes it)
BUSY_WAIT_S, BUSY_TRIES = 0.01, 1000


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
        background: bool = True,
    ) -> None:
        """``background``: hints to the controller are sent, and ended attempts are finished, on
        threads of the agent's own; False: on the caller's (a harness that steps the agent itself)."""
        self.settings, self.cfg = settings, settings.agent
        self.background = background
        self.address = self.cfg.address or address_of(self.cfg.node_name)
        self.node = self.cfg.node_name
        self.jobs, self.nodes, self.bus = jobs, nodes, bus
        self.retention = Stores.of(settings, jobs, nodes).retention
        self.inventory, self.runtime, self.supervisor, self.clock = inventory, runtime, supervisor, clock
        self.agent_id = _agent_id(self.cfg.state_dir)
        self.renewed_at = 0.0  # wall clock of the last renewal (heartbeat lag metric)
        #: pids of fleet's own processes, refreshed by reconcile: the heartbeat never waits on Docker
        self._fleet_pids: set[int] = set()
        self.stop_event = threading.Event()
        self.logs = LogShipper(
            runtime,
            jobs,
            settings.log_max_lines,
            self.cfg.log_ship_interval_s,
            self.stop_event,
            max_line_bytes=settings.log_max_line_bytes,
            max_bytes=settings.log_max_bytes,
        )
        self._health = StepHealth(log)
        #: attempts the runtime says ended, for the threads that finish them (None: stop)
        self._ended: queue.SimpleQueue[tuple[str, int, int] | None] = queue.SimpleQueue()
        self.pumps = StdinPumps(
            runtime, supervisor, self.stop_event, lambda: StdinStreams(connect_binary(settings), jobs.keys)
        )
        self.notifier = Notifier()
        self.parts = Parts(
            settings,
            jobs,
            nodes,
            bus,
            Hints(lambda: bus, background=background, log=log, failed="attempt_notify_failed"),
            inventory,
            runtime,
            supervisor,
            self.logs,
            self.pumps,
            clock,
            self.stop_event,
            publish=lambda: self._guarded(self.heartbeat),
        )
        self.inflight = self.parts.inflight
        self.exits = ExitPath(self.parts)
        self.launcher = Launcher(self.parts, self.exits)
        self.shells = Shells(
            settings, jobs, self.stop_event, lambda: ShellRelay(connect_binary(settings), jobs.keys)
        )

    # -- main loop -------------------------------------------------------------------

    def run(self) -> None:
        """The heartbeat loop runs here and waits on nothing but Redis and the local supervisor;
        launches (image pulls), exits and reconcile run on other threads."""
        jobs_as = f"job_user {self.cfg.job_user}" if self.cfg.job_user else f"uids {self.cfg.job_uid_range}"
        event(
            log,
            "agent_start",
            node=self.node,
            runtime=self.runtime.name,
            gpus=self.inventory.backend,
            redis=self.settings.redis_display,
            version=VERSION,
            jobs_as=jobs_as,
        )
        self.clean_workdir_temp()
        self.supervisor.ensure()
        self.heartbeat()
        metrics.serve(
            metrics.agent_registry(self, self.clock), self.cfg.metrics_port, self.cfg.metrics_address, log
        )
        queue = node_queue(self.node)
        self.bus.handle(queue, Launch, self.on_launch)
        self.bus.handle(queue, Stop, self.on_stop)
        self.bus.handle(queue, Rebatch, self.on_rebatch)
        self.bus.handle(queue, ShellOpen, self.shells.open)
        worker = self.bus.worker(queue, self.cfg.worker_threads)
        self.logs.start()
        enders = [
            threading.Thread(target=self._end_loop, name=f"ended-{i}", daemon=True)
            for i in range(self.cfg.worker_threads)
        ]
        for thread in enders:
            thread.start()
        self.runtime.watch(lambda job_id, attempt: self._ended.put((job_id, attempt, 0)), self.stop_event)
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
            for _ in enders:
                self._ended.put(None)
            for thread in enders:
                thread.join(timeout=10)
            self.parts.hints.close()
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
            event(
                log,
                "workdir_temp_cleaned",
                node=self.node,
                dir=folder,
                removed=len(removed),
                names=",".join(removed),
            )

    def _guarded(self, step: Callable[[], object]) -> None:
        self._health.guard(step, node=self.node)

    def heartbeat(self) -> None:
        gpus = self.inventory.gpus()
        fleet_pids = self._fleet_pids
        gpus = [
            g.model_copy(update={"busy": busy_reason(g, fleet_pids, self.cfg.gpu_busy_memory)}) for g in gpus
        ]
        info = NodeInfo(
            gpus=gpus,
            cpus=self.cfg.cpus or os.cpu_count() or 0,
            memory=self.cfg.memory or psutil.virtual_memory().total,
            runtime=self.runtime.name,
            gpu_backend=self.inventory.backend,
            address=self.address,
            labels=self.cfg.labels,
        )
        sent = time.monotonic()  # the lease runs from no later than this
        joined = self.nodes.heartbeat(self.node, self.agent_id, self.cfg.node_lease_ttl_s, self.clock(), info)
        self.renewed_at = self.clock()
        if joined:
            event(log, "node_joined", node=self.node, gpus=len(gpus))
            self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=self.node))
        # the fence counts only renewals the replicas hold: a promoted replica's lease must not
        # expire (and the node's jobs run elsewhere) before this node stopped them
        if confirmed(self.nodes.redis, self.nodes.keys):
            self._confirm_lease(sent + self.cfg.node_lease_ttl_s)

    def _confirm_lease(self, until: float) -> None:
        """Tell the supervisor how long the lease holds; it stops every attempt before then."""
        try:
            self.supervisor.lease(until)
        except OSError as exc:
            raise LaunchError(f"node supervisor unreachable: {exc}", retryable=True) from exc

    # -- messages and the runtime's callbacks ----------------------------------------

    def on_launch(self, msg: Launch) -> None:
        self.launcher.launch(msg.job_id, msg.attempt)

    def on_stop(self, msg: Stop) -> None:
        """Stop the attempt; its exit then comes through ``on_exit``, as any other's."""
        event(log, "attempt_stop", job=msg.job_id, attempt=msg.attempt, reason=msg.reason)
        # a stop under way: reconcile must not stop it again with stop_grace_s, which would cut short
        # the grace this one gave (a preemption's or a resize's, to checkpoint in)
        key = (msg.job_id, msg.attempt)
        self.inflight.stopping.add(key)
        try:
            self.runtime.stop(msg.job_id, msg.attempt, msg.grace_s)  # returns once it no longer runs
        finally:
            self.inflight.stopping.discard(key)

    def on_rebatch(self, msg: Rebatch) -> None:
        """Tell the attempt its new batch (it follows such a change while it runs); a reconcile tells
        it again from the job's record when this message is lost."""
        self._tell_batch(msg.job_id, msg.attempt, msg.batch_size)

    def _tell_batch(self, job_id: str, attempt: int, batch: int) -> None:
        runtime = self.runtime
        if not isinstance(runtime, Batched) or runtime.batch_of(job_id, attempt) in (None, batch):
            return
        if runtime.set_batch(job_id, attempt, batch):
            event(log, "attempt_rebatched", job=job_id, attempt=attempt, batch=batch)

    def _end_loop(self) -> None:
        """Finish the attempts the runtime says ended, ``worker_threads`` at a time: one attempt's
        Redis round trips and last log lines do not hold up the next one's end (and its GPUs). One
        that ended before its launch was done is finished as soon as the launch is: a job that exits
        at once does not hold its GPUs until the next reconcile."""
        while (ended := self._ended.get()) is not None:
            job_id, attempt, tries = ended
            if not self.on_exit(job_id, attempt) and tries < BUSY_TRIES and not self.stop_event.is_set():
                time.sleep(BUSY_WAIT_S)
                self._ended.put((job_id, attempt, tries + 1))

    def on_exit(self, job_id: str, attempt: int) -> bool:
        """An attempt ended: finish it now. False when another thread holds it (its launch is not
        done yet). On an error (Redis, the runtime) the next reconcile finishes it: this runs on
        the threads that finish every attempt, which an unexpected error must not end."""
        try:
            status = status_of(self.runtime, job_id, attempt)
            if status is not None and status.exit is not None:
                return self.exits.finish(job_id, attempt, status.exit)
        except FleetError as exc:
            event(log, "exit_not_recorded", logging.WARNING, job=job_id, attempt=attempt, error=exc)
        except Exception:  # a bug or a runtime's own error: its traceback, and the thread goes on
            log.exception(kv("exit_not_recorded", job=job_id, attempt=attempt))
        return True

    # -- reconcile -------------------------------------------------------------------

    def reconcile(self) -> None:
        """Make the node match state: finish exited attempts, kill stale ones, launch lost launches."""
        # in this order: a launch running while the node's jobs are read is still busy when busy is
        # read, or already held when the runtime is listed, so it never looks lost
        on_node = self.jobs.on_node(self.node)
        busy = self.inflight.busy()
        held = self.runtime.attempts()
        self._fleet_pids = self.runtime.pids()
        jobs = {j.id: j for j in self.jobs.get_many({a.job_id for a in held})}
        self.exits.enforce_time_limits(held, jobs)
        todo = plan.reconcile(self.node, held, jobs, on_node, busy, self.logs.following())
        for status in todo.stale:
            event(log, "stale_attempt_killed", job=status.job_id, attempt=status.attempt)
            self.runtime.stop(status.job_id, status.attempt, 0)
            self.exits.remove(status.job_id, status.attempt)
        for status in todo.stop:
            self._stop_in_background(status.job_id, status.attempt)
        for status in todo.reattach:
            event(log, "attempt_reattached", job=status.job_id, attempt=status.attempt)
            self.runtime.supervise(status.job_id, status.attempt)
            job = jobs.get(status.job_id)
            rank = (job.rank_on(self.node) or 0) if job else 0
            self.logs.follow(status.job_id, status.attempt, rank)
            if job is not None:
                self.pumps.follow(job, status.attempt, rank)
        for status, batch in todo.rebatch:
            self._tell_batch(status.job_id, status.attempt, batch)
        for status in todo.finish:
            assert status.exit is not None
            self.exits.finish(status.job_id, status.attempt, status.exit)
        for job in todo.launch:
            self.launcher.launch(job.id, job.attempt)
        for job in todo.lost:
            self.exits.lost(job)

    def _stop_in_background(self, job_id: str, attempt: int) -> None:
        """Stop an attempt whose stop message may have been lost, without holding up reconcile."""
        stopping = self.inflight.stopping
        if (job_id, attempt) in stopping:
            return
        stopping.add((job_id, attempt))
        threading.Thread(
            target=self.runtime.stop, args=(job_id, attempt, self.cfg.stop_grace_s), daemon=True
        ).start()

    def _stop_all(self) -> None:
        for status in self.runtime.attempts():
            if status.running:
                self.runtime.stop(status.job_id, status.attempt, self.cfg.stop_grace_s)
            self.exits.remove(status.job_id, status.attempt)


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
