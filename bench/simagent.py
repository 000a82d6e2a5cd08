"""What the node simulator's nodes do with their attempts (``bench/nodesim.py``): the agent's
launch, stop, end and lost paths (``fleet/agent/launcher.py``, ``exits.py``), through the same store
calls (and the same ``settle``), over a null runtime whose processes are timers.

An attempt is keyed by (job, attempt, node): a multi-node job's members run on different simulated
nodes at once, each holding its GPUs on its own node, and move through ``member.lua`` as the real
agent's do: the job is STARTING with its first member and RUNNING once every member runs; a member
that ends with 0 is done, the last one done ends the job; a member that fails ends the attempt and
the others are sent ``Stop``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bench.simfleet import Attempt, Key, SimNode, Stats, run_for
from fleet.agent.exits import settle
from fleet.agent.members import member_failed
from fleet.agent.reconcile import still_lost
from fleet.bus import CONTROLLER_QUEUE, AttemptUpdate, Bus, Stop, node_queue
from fleet.config import Settings
from fleet.errors import FleetError, NotFound
from fleet.lifecycle import RetryPolicy, decide
from fleet.log import event
from fleet.models import Exit, ExitKind, Fault, Job, JobState, MemberPhase
from fleet.state import JobStore, NodeStore

log = logging.getLogger("bench.nodesim")


def launchable(job: Job) -> tuple[JobState, ...]:
    """The states a launch starts from: a multi-node job is STARTING once its first member starts."""
    return (JobState.SCHEDULED, JobState.STARTING) if len(job.members) > 1 else (JobState.SCHEDULED,)


class SimAgent:
    """Every simulated node's attempts, on one thread pool; timers end them."""

    def __init__(
        self,
        settings: Settings,
        jobs: JobStore,
        nodes: NodeStore,
        bus: Bus,
        *,
        stats: Stats,
        pool: ThreadPoolExecutor,
        stop_event: threading.Event,
        default_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.jobs, self.nodes, self.bus, self.clock = settings.agent, jobs, nodes, bus, clock
        self.policy = RetryPolicy(
            settings.retry_backoff_s, settings.retry_backoff_max_s, settings.max_infra_requeues
        )
        self.stats, self.pool, self.stop_event, self.default_s = stats, pool, stop_event, default_s
        self._lock = threading.Lock()
        self._busy: set[Key] = set()
        self._running: dict[Key, Attempt] = {}
        self._timer: list[tuple[float, int, Key]] = []
        self._timer_cond = threading.Condition(self._lock)
        self._seq = itertools.count()

    def wake(self) -> None:
        """Let the timer loop see ``stop_event``."""
        with self._timer_cond:
            self._timer_cond.notify_all()

    def known(self) -> dict[str, set[tuple[str, int]]]:
        """Per node, the (job, attempt) being launched, finished or running there."""
        with self._lock:
            keys = self._busy | set(self._running)
        by_node: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for job_id, attempt, node in keys:
            by_node[node].add((job_id, attempt))
        return by_node

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    # -- launch ------------------------------------------------------------------------

    def launch(self, node: SimNode, job_id: str, attempt: int) -> None:
        key = (job_id, attempt, node.name)
        if not self._claim(key):
            return
        try:
            with self._lock:
                held = key in self._running
            seconds = None if held else self._launch(node, job_id, attempt)
        finally:
            self._release(key)
        if seconds is not None:
            self._arm(key, seconds)

    def _launch(self, node: SimNode, job_id: str, attempt: int) -> float | None:
        """As the agent's ``_launch``; how long the attempt runs, or None when it does not."""
        job = self._launchable(node, job_id, attempt)
        if job is None:
            self.stats.ignored += 1
            return None
        rank, gang = job.rank_on(node.name) or 0, len(job.members) > 1
        member = f" (member {rank} of {len(job.members)})" if gang else ""
        if not self.jobs.transition(
            job_id,
            attempt=attempt,
            allowed=launchable(job),
            to=JobState.STARTING,
            reason=f"starting on {node.name}{member}",
            now=self.clock(),
        ):
            return None
        seconds, code = run_for(job.spec, self.default_s)
        run = Attempt(job_id, attempt, node, job.gpus_on(node.name), code, rank)
        if job.cancel_requested:
            self._end(run, Exit(fault=Fault.CANCEL, reason="cancelled before start"), job)
            return None
        conflict = self._hold(run)
        if conflict:
            self._end(run, Exit(reason=conflict, fault=Fault.INFRA, kind=ExitKind.GPU_BUSY), job)
            return None
        with self._lock:
            self._running[run.key] = run
        if not self._started(job, rank):
            with self._lock:
                self._running.pop(run.key, None)
            self._free(run)  # the controller gave up on this launch meanwhile
            return None
        self.stats.launched += 1
        started = AttemptUpdate(job_id=job_id, attempt=attempt, node=node.name, phase="started")
        self.bus.send(CONTROLLER_QUEUE, started)
        return seconds

    def _launchable(self, node: SimNode, job_id: str, attempt: int) -> Job | None:
        """The job when this attempt is to start on ``node``: its current attempt, placed there, not
        started yet (a multi-node job's member on ``node`` moved to starting through member.lua)."""
        try:
            job = self.jobs.get(job_id)
        except NotFound:
            return None
        rank = job.rank_on(node.name)
        if rank is None or job.attempt != attempt or job.state not in launchable(job):
            return None
        if len(job.members) > 1 and self.jobs.member(job, rank, MemberPhase.STARTING) < 0:
            return None  # this member started already
        return job

    def _started(self, job: Job, rank: int) -> bool:
        """As the agent's ``_running``: the job is RUNNING, a multi-node job once every member runs
        (the last member to run moves it); False when the launch went stale meanwhile."""
        if len(job.members) > 1:
            running = self.jobs.member(job, rank, MemberPhase.RUNNING)
            if running < 0:
                return False
            if running < len(job.members):
                return True
        where = f"{len(job.members)} nodes" if len(job.members) > 1 else job.nodes_held[rank]
        return self.jobs.transition(
            job.id,
            attempt=job.attempt,
            allowed=[JobState.STARTING],
            to=JobState.RUNNING,
            reason=f"running on {where}",
            now=self.clock(),
            fields={"started_at": self.clock()},
        )

    def _hold(self, run: Attempt) -> str:
        """Take the attempt's GPUs on its node; why not, if one is unknown there or held by another
        attempt (a double claim, counted)."""
        with self._lock:
            why = run.node.unknown(run.gpus)
            if why:
                return why
            conflict = run.node.hold(run.key, run.gpus)
            if conflict:
                self.stats.conflicts.append(conflict)
                return f"busy: {conflict}"
        return ""

    def _free(self, run: Attempt) -> None:
        with self._lock:
            run.node.free(run.key, run.gpus)

    def stop_attempt(self, node: SimNode, job_id: str, attempt: int, reason: str) -> None:
        """A simulated process stops at once on SIGTERM (the real agent waits up to the grace); one
        not running (yet, or any more) on ``node`` is not stopped, as with the real runtime."""
        exit = Exit(code=143, reason=f"exited with code 143 (SIGTERM): {reason}")
        self.finish((job_id, attempt, node.name), exit)

    # -- ends --------------------------------------------------------------------------

    def _claim(self, key: Key) -> bool:
        """Launching, finishing and reconciling one attempt never overlap (as the agent's ``_busy``)."""
        with self._lock:
            if key in self._busy:
                return False
            self._busy.add(key)
            return True

    def _release(self, key: Key) -> None:
        with self._lock:
            self._busy.discard(key)

    def _arm(self, key: Key, seconds: float) -> None:
        with self._timer_cond:
            heapq.heappush(self._timer, (time.monotonic() + seconds, next(self._seq), key))
            self._timer_cond.notify()

    def timer_loop(self) -> None:
        while not self.stop_event.is_set():
            with self._timer_cond:
                now = time.monotonic()
                while self._timer and self._timer[0][0] <= now:
                    _, _, key = heapq.heappop(self._timer)
                    self.pool.submit(self.finish, key, None)
                wait = self._timer[0][0] - now if self._timer else 1.0
                self._timer_cond.wait(min(wait, 1.0))

    def finish(self, key: Key, exit: Exit | None) -> None:
        """End a running simulated attempt: its time is up (``exit`` None) or it was stopped."""
        if not self._claim(key):
            if exit is None:  # its time is up while something else holds it: look again soon
                self._arm(key, 0.05)
            return
        try:
            with self._lock:
                run = self._running.get(key)
            if run is None:
                return
            self._finish(run, exit or Exit(code=run.code, reason=f"exited with code {run.code}"))
            with self._lock:
                self._running.pop(key, None)
        except FleetError as exc:  # as the agent: a Redis error leaves it to be finished again
            self.stats.errors += 1
            event(log, "finish_failed", logging.WARNING, job=key[0], attempt=key[1], node=key[2], error=exc)
            self._arm(key, 1.0)
        finally:
            self._release(key)

    def _finish(self, run: Attempt, exit: Exit) -> None:
        """As the agent's ``finish``: only the job's current attempt, still on a node, is ended."""
        try:
            job = self.jobs.get(run.job_id)
        except NotFound:
            self._free(run)
            return
        if job.attempt != run.attempt or job.state not in (JobState.STARTING, JobState.RUNNING):
            self._free(run)
            return
        self._end(run, exit, job)

    def _end(self, run: Attempt, exit: Exit, job: Job) -> None:
        """As the agent's ``ExitPath.end``: record the exit, free the GPUs, then end the attempt. A multi-node
        job's member that ended with 0 is done, and the last one done ends the attempt; one that failed
        ends it at once, and the members on the other nodes are stopped."""
        # settled as the agent's (no supervisor fences a simulated attempt, and it writes no output)
        exit = settle(job, exit, run.node.name, fenced=None, timed_out=False, now=self.clock(), tail=list)
        self.jobs.record_exit(job, exit, self.clock())
        self._free(run)  # the runtime's remove: GPUs free before the claims are released
        gang = len(job.members) > 1
        if gang and exit.succeeded:
            if self.jobs.member(job, run.rank, MemberPhase.DONE) < len(job.members):  # the others still run
                self.stats.members_done += 1
                return
        elif gang:
            wait_s = self.cfg.node_lease_ttl_s + self.cfg.heartbeat_interval_s
            exit = member_failed(self.jobs, self.nodes, job, run.node.name, exit, wait_s, self.stop_event)
        decision = decide(job, exit, self.policy)
        if not self.jobs.end_attempt(job, exit, decision, self.clock(), {"checkpoint": None}):
            return
        if gang:  # one member's end is the attempt's: stop the others now
            stop = Stop(
                job_id=job.id, attempt=job.attempt, reason=decision.reason, grace_s=self.cfg.stop_grace_s
            )
            for name in set(job.nodes_held) - {run.node.name}:
                self.bus.send(node_queue(name), stop)
        self.stats.finished += 1
        if decision.state == JobState.SUCCEEDED:
            self.stats.succeeded[job.id] += 1
        self.bus.send(
            CONTROLLER_QUEUE,
            AttemptUpdate(
                job_id=job.id,
                attempt=job.attempt,
                node=run.node.name,
                phase="exited",
                exit_code=exit.code,
                oom=exit.oom,
                reason=exit.reason,
            ),
        )

    def lost(self, node: SimNode, job: Job) -> None:
        """As the agent's ``ExitPath.lost``: the end recorded before the removal, if any (a multi-node job's
        is not this member's), else it vanished."""
        run = Attempt(job.id, job.attempt, node, job.gpus_on(node.name), rank=job.rank_on(node.name) or 0)
        if not self._claim(run.key):
            return
        try:
            with self._lock:
                held = run.key in self._running
            try:
                now = self.jobs.get(job.id)
            except NotFound:
                return
            if not held and still_lost(node.name, job, now):
                job = now
                recorded = job.last_exit_attempt == job.attempt and len(job.members) <= 1
                why = f"attempt vanished from node {node.name}"
                lost = Exit(fault=Fault.INFRA, kind=ExitKind.LOST, reason=why)
                self._finish(run, (job.last_exit if recorded else None) or lost)
        finally:
            self._release(run.key)
