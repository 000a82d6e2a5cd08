"""A node simulator: hundreds or thousands of nodes speaking the agent's protocol from one process.

Everything the controller sees is what real agents produce, through the same code: node leases
and inventories through the agent's heartbeat script (batched: one pipeline per round for all
nodes, not a thread per node), ``Launch`` and ``Stop`` from each node's own bus queue (see
``bench/simbus.py``), SCHEDULED -> STARTING -> RUNNING with ``JobStore.transition``, the end with
``JobStore.record_exit`` and ``JobStore.end_attempt``, ``AttemptUpdate`` and ``NodeChanged`` to the
controller queue. Only the runtime is null: a job "runs" for

- its label ``FLEET_SIM_SECONDS`` (and exits with label ``FLEET_SIM_EXIT``, default 0), or
- ``N`` seconds for the command ``sleep N``; ``true`` and ``false`` end at once with 0 and 1;
- else ``--default-seconds``.

Each simulated GPU knows which attempt holds it: a launch onto a GPU another simulated attempt
still holds is a *conflict* (a double claim; the real agent's NVML check would refuse it too),
counted in the stats and refused the way the agent refuses a busy GPU.

Run: ``python -m bench.nodesim --nodes 1000 --gpus 8`` (``--group`` for mixed fleets), with
``FLEET_REDIS_URL`` or ``--redis-url``; ``--stats FILE`` keeps a JSON summary up to date.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dramatiq

from bench.harness import CpuMeter
from bench.simbus import DramatiqConsumer, SharedConsumer
from bench.simfleet import Attempt, Group, SimNode, Stats, make_nodes, run_for
from fleet import log as fleet_log
from fleet.bus import CONTROLLER_QUEUE, AttemptUpdate, Bus, Launch, NodeChanged, Stop
from fleet.config import Settings, load_settings
from fleet.errors import FleetError, NotFound
from fleet.keys import Keys
from fleet.lifecycle import CANCEL, INFRA, JOB, RetryPolicy
from fleet.log import event
from fleet.models import Exit, Job, JobState
from fleet.state import JobStore, NodeStore, connect
from fleet.state.connection import load_scripts

log = logging.getLogger("bench.nodesim")
AGENT_ID = "nodesim"
ACTORS = {m: m.model_fields["actor"].default for m in (Launch, Stop)}


class NodeSim:
    def __init__(self, settings: Settings, groups: list[Group], *, consumer: str = "shared",
                 threads: int = 8, default_s: float = 0.0, reconcile_s: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.settings, self.cfg, self.clock = settings, settings.agent, clock
        keys = Keys(settings.key_prefix)
        self.jobs, self.nodes = JobStore(connect(settings), keys), NodeStore(connect(settings), keys)
        self.keys, self.bus = keys, Bus(settings)
        self._heartbeat = load_scripts(self.nodes.redis)["heartbeat"]
        self.policy = RetryPolicy(settings.retry_backoff_s, settings.retry_backoff_max_s,
                                  settings.max_infra_requeues)  # fmt: skip
        self.sim_nodes = make_nodes(groups)
        self.by_queue = {n.queue: n for n in self.sim_nodes}
        self.default_s, self.reconcile_s = default_s, reconcile_s
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="sim")
        self._lock = threading.Lock()
        self._busy: set[tuple[str, int]] = set()
        self._running: dict[tuple[str, int], Attempt] = {}
        self._timer: list[tuple[float, int, tuple[str, int]]] = []
        self._timer_cond = threading.Condition(self._lock)
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        queues = [n.queue for n in self.sim_nodes]
        self.consumer: SharedConsumer | DramatiqConsumer = (
            SharedConsumer(self.bus, queues, self.on_message, self.pool)
            if consumer == "shared"
            else DramatiqConsumer(self.bus, queues, self.on_message, [ACTORS[Launch], ACTORS[Stop]], threads)
        )

    # -- lifecycle of the simulator ----------------------------------------------------

    def start(self) -> None:
        self.heartbeat_round()
        self.consumer.start()
        for target in (self._heartbeat_loop, self._timer_loop, self._reconcile_loop):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stop_event.set()
        with self._timer_cond:
            self._timer_cond.notify_all()
        self.consumer.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.bus.close()

    def __enter__(self) -> NodeSim:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- heartbeats --------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        every = self.cfg.heartbeat_interval_s
        while not self.stop_event.wait(max(every - self.stats.heartbeat_last_s, 0.0)):
            self._guarded(self.heartbeat_round)

    def heartbeat_round(self) -> None:
        """Renew every node's lease with the agent's own heartbeat script, all in one pipeline."""
        started, now = time.monotonic(), self.clock()
        ttl_ms = int(self.cfg.node_lease_ttl_s * 1000)
        pipe = self.nodes.redis.pipeline(transaction=False)
        for node in self.sim_nodes:
            self._heartbeat(keys=self.nodes.heartbeat_keys(node.name),
                            args=[AGENT_ID, ttl_ms, now, node.name, node.fields], client=pipe)  # fmt: skip
        for node, (code, holder) in zip(self.sim_nodes, pipe.execute(), strict=True):
            if code == -1:
                event(log, "lease_conflict", logging.WARNING, node=node.name, holder=holder)
            elif code == 1:
                self.stats.joined += 1
                self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=node.name))
        took = time.monotonic() - started
        self.stats.heartbeat_rounds += 1
        self.stats.heartbeat_last_s, self.stats.heartbeat_max_s = took, max(took, self.stats.heartbeat_max_s)

    # -- messages ----------------------------------------------------------------------

    def on_message(self, queue: str, message: dramatiq.Message[Any]) -> None:
        node = self.by_queue[queue]
        if message.actor_name == ACTORS[Launch]:
            launch = Launch.model_validate(message.kwargs)
            self.launch(node, launch.job_id, launch.attempt)
        elif message.actor_name == ACTORS[Stop]:
            stop = Stop.model_validate(message.kwargs)
            self.stop_attempt(stop.job_id, stop.attempt, stop.reason)
        else:
            event(log, "unknown_message", logging.WARNING, queue=queue, actor=message.actor_name)

    def launch(self, node: SimNode, job_id: str, attempt: int) -> None:
        key = (job_id, attempt)
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
        try:
            job = self.jobs.get(job_id)
        except NotFound:
            job = None
        if job is None or job.node != node.name or job.attempt != attempt or job.state != JobState.SCHEDULED:
            self.stats.ignored += 1
            return None
        if not self.jobs.transition(job_id, attempt=attempt, allowed=[JobState.SCHEDULED],
                                    to=JobState.STARTING, reason=f"starting on {node.name}",
                                    now=self.clock()):  # fmt: skip
            return None
        seconds, code = run_for(job.spec, self.default_s)
        run = Attempt(job_id, attempt, node, list(job.gpus), code)
        if job.cancel_requested:
            self._end(run, Exit(fault=CANCEL, reason="cancelled before start"), job)
            return None
        conflict = self._hold(run)
        if conflict:
            self._end(run, Exit(reason=conflict, fault=INFRA, kind="gpu_busy"), job)
            return None
        with self._lock:
            self._running[run.key] = run
        if not self.jobs.transition(job_id, attempt=attempt, allowed=[JobState.STARTING], to=JobState.RUNNING,
                                    reason=f"running on {node.name}", now=self.clock(),
                                    fields={"started_at": self.clock()}):  # fmt: skip
            with self._lock:
                self._running.pop(run.key, None)
            self._free(run)  # the controller gave up on this launch meanwhile
            return None
        self.stats.launched += 1
        started = AttemptUpdate(job_id=job_id, attempt=attempt, node=node.name, phase="started")
        self.bus.send(CONTROLLER_QUEUE, started)
        return seconds

    def _hold(self, run: Attempt) -> str:
        """Take the attempt's GPUs; why not, if one is unknown here or held by another attempt."""
        with self._lock:
            known = {g.uuid for g in run.node.gpus}
            for uuid in run.gpus:
                holder = run.node.held.get(uuid)
                if uuid not in known:
                    return f"GPU {uuid} is not on node {run.node.name}"
                if holder is not None:
                    why = f"{run.job_id}:{run.attempt} wants {uuid} held by {holder[0]}:{holder[1]}"
                    self.stats.conflicts.append(why)
                    return f"busy: {why}"
            for uuid in run.gpus:
                run.node.held[uuid] = run.key
        return ""

    def _free(self, run: Attempt) -> None:
        with self._lock:
            for uuid in run.gpus:
                if run.node.held.get(uuid) == run.key:
                    del run.node.held[uuid]

    def stop_attempt(self, job_id: str, attempt: int, reason: str) -> None:
        """A simulated process stops at once on SIGTERM (the real agent waits up to the grace); one
        not running yet is not stopped, as with the real runtime."""
        self.finish((job_id, attempt), Exit(code=143, reason=f"exited with code 143 (SIGTERM): {reason}"))

    # -- ends --------------------------------------------------------------------------

    def _claim(self, key: tuple[str, int]) -> bool:
        """Launching, finishing and reconciling one attempt never overlap (as the agent's ``_busy``)."""
        with self._lock:
            if key in self._busy:
                return False
            self._busy.add(key)
            return True

    def _release(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._busy.discard(key)

    def _arm(self, key: tuple[str, int], seconds: float) -> None:
        with self._timer_cond:
            heapq.heappush(self._timer, (time.monotonic() + seconds, next(self._seq), key))
            self._timer_cond.notify()

    def _timer_loop(self) -> None:
        while not self.stop_event.is_set():
            with self._timer_cond:
                now = time.monotonic()
                while self._timer and self._timer[0][0] <= now:
                    _, _, key = heapq.heappop(self._timer)
                    self.pool.submit(self.finish, key, None)
                wait = self._timer[0][0] - now if self._timer else 1.0
                self._timer_cond.wait(min(wait, 1.0))

    def finish(self, key: tuple[str, int], exit: Exit | None) -> None:
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
            event(log, "finish_failed", logging.WARNING, job=key[0], attempt=key[1], error=exc)
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
        """As the agent's ``_finish``: record the exit, free the GPUs, then end the attempt."""
        if job.preempt and not job.cancel_requested and not (exit.code == 0 and exit.fault == JOB):
            exit = Exit(code=exit.code, fault=INFRA, kind="drain", reason=f"{job.preempt}: {exit.reason}")
        self.jobs.record_exit(job, exit, self.clock())
        self._free(run)  # the runtime's remove: GPUs free before the claims are released
        decision = self.jobs.end_attempt(job, exit, self.policy, self.clock(), {"checkpoint": None})
        if decision is None:
            return
        self.stats.finished += 1
        if decision.state == JobState.SUCCEEDED:
            self.stats.succeeded[job.id] += 1
        self.bus.send(CONTROLLER_QUEUE, AttemptUpdate(
            job_id=job.id, attempt=job.attempt, node=run.node.name, phase="exited", exit_code=exit.code,
            reason=exit.reason,
        ))  # fmt: skip

    # -- reconcile ---------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self.stop_event.wait(self.reconcile_s):
            self._guarded(self.reconcile)

    def reconcile(self) -> None:
        """Launch what Redis placed here but no message delivered; end attempts this simulator does
        not hold (from an earlier run) as lost, as the agent does. Redis is read before what is busy
        and running here: a launch under way while Redis is read is still busy, or already running."""
        pipe = self.nodes.redis.pipeline(transaction=False)
        for node in self.sim_nodes:
            pipe.smembers(self.keys.node_jobs(node.name))
        placed = {job_id: node for node, ids in zip(self.sim_nodes, pipe.execute(), strict=True)
                  for job_id in ids}  # fmt: skip
        jobs = [j for j in self.jobs.get_many(placed) if j.node == placed[j.id].name]
        with self._lock:
            known = self._busy | set(self._running)
        for job in jobs:
            if (job.id, job.attempt) in known:
                continue
            if job.state == JobState.SCHEDULED:
                self.pool.submit(self.launch, placed[job.id], job.id, job.attempt)
            elif job.state in (JobState.STARTING, JobState.RUNNING):
                self.pool.submit(self._lost, placed[job.id], job)

    def _lost(self, node: SimNode, job: Job) -> None:
        key = (job.id, job.attempt)
        if not self._claim(key):
            return
        try:
            with self._lock:
                held = key in self._running
            if not held:
                exit = Exit(fault=INFRA, kind="lost", reason=f"attempt vanished from node {node.name}")
                self._finish(Attempt(job.id, job.attempt, node, []), exit)
        finally:
            self._release(key)

    # -- reporting ---------------------------------------------------------------------

    def _guarded(self, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:
            self.stats.errors += 1
            event(log, "step_failed", logging.WARNING, step=getattr(step, "__name__", "?"), error=exc)

    def summary(self) -> dict[str, Any]:
        s = self.stats
        with self._lock:
            running, held = len(self._running), sum(len(n.held) for n in self.sim_nodes)
        return {
            "nodes": len(self.sim_nodes), "gpus": sum(len(n.gpus) for n in self.sim_nodes),
            "running": running, "gpus_held": held, "launched": s.launched, "finished": s.finished,
            "succeeded_jobs": len(s.succeeded), "succeeded_twice": sum(c > 1 for c in s.succeeded.values()),
            "ignored": s.ignored, "conflicts": len(s.conflicts), "conflict_examples": s.conflicts[:5],
            "joined": s.joined, "heartbeat_rounds": s.heartbeat_rounds,
            "heartbeat_last_ms": round(s.heartbeat_last_s * 1000, 1),
            "heartbeat_max_ms": round(s.heartbeat_max_s * 1000, 1), "errors": s.errors,
            "consumer_rounds": getattr(self.consumer, "rounds", None),
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", help="default: $FLEET_REDIS_URL")
    parser.add_argument("--nodes", type=int, default=100, help="nodes of --gpus GPUs (unless --group)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--group", action="append", type=Group.parse, default=[],
                        help="COUNT[:GPUS[:MODEL[:PREFIX]]], repeatable; replaces --nodes")  # fmt: skip
    parser.add_argument("--consumer", choices=["shared", "dramatiq"], default="shared")
    parser.add_argument("--threads", type=int, default=8, help="launch/finish threads")
    parser.add_argument("--default-seconds", type=float, default=0.0)
    parser.add_argument("--stats", type=Path, help="write a JSON summary here every second")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: never)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    fleet_log.setup(args.log_level)
    settings = load_settings(redis_url=args.redis_url)
    groups = args.group or [Group(args.nodes, args.gpus)]
    sim = NodeSim(
        settings, groups, consumer=args.consumer, threads=args.threads, default_s=args.default_seconds
    )
    signal.signal(signal.SIGTERM, lambda *_: sim.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: sim.stop_event.set())
    meter, started = CpuMeter(), time.monotonic()
    sim.start()
    event(log, "nodesim_start", nodes=len(sim.sim_nodes), consumer=args.consumer)
    while not sim.stop_event.wait(1.0):
        summary = {**sim.summary(), "cpu_percent": round(meter.percent(), 1),
                   "cpu_seconds": round(meter.last[1], 2), "at": time.time()}  # fmt: skip
        if args.stats:
            tmp = args.stats.with_suffix(".tmp")
            tmp.write_text(json.dumps(summary))
            tmp.replace(args.stats)
        if args.duration and time.monotonic() - started >= args.duration:
            break
    sim.stop()
    print(json.dumps(sim.summary()), flush=True)


if __name__ == "__main__":
    main()
