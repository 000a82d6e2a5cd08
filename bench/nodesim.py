"""A node simulator: hundreds or thousands of nodes speaking the agent's protocol from one process.

Everything the controller sees is what real agents produce, through the same code: node leases
and inventories through the agent's heartbeat script (batched: one pipeline per round for all
nodes, not a thread per node), ``Launch`` and ``Stop`` from each node's own bus queue (see
``bench/simbus.py``), SCHEDULED -> STARTING -> RUNNING with ``JobStore.transition``, the end with
``JobStore.record_exit`` and ``JobStore.end_attempt``, ``AttemptUpdate`` and ``NodeChanged`` to the
controller queue; a multi-node job's members, one per simulated node, through ``JobStore.member``
as the agent's (see ``bench/simagent.py``). Only the runtime is null: a job "runs" for

- its label ``FLEET_SIM_SECONDS`` (and exits with label ``FLEET_SIM_EXIT``, default 0), or
- ``N`` seconds for the command ``sleep N``; ``true`` and ``false`` end at once with 0 and 1;
- else ``--default-seconds``.

Each simulated GPU knows which attempt (job, attempt, node) holds it: a launch onto a GPU another
simulated attempt still holds is a *conflict* (a double claim; the real agent's NVML check would
refuse it too), counted in the stats and refused the way the agent refuses a busy GPU.

Run: ``python -m bench.nodesim --nodes 1000 --gpus 8`` (``--group`` for mixed fleets), with
``FLEET_REDIS_URL`` or ``--redis-url``; ``--stats FILE`` keeps a JSON summary up to date.
"""

from __future__ import annotations

import argparse
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
from bench.simagent import SimAgent
from bench.simbus import DramatiqConsumer, SharedConsumer
from bench.simfleet import Group, Stats, make_nodes
from fleet import log as fleet_log
from fleet.agent import reconcile as plan
from fleet.bus import CONTROLLER_QUEUE, Bus, Launch, NodeChanged, Stop
from fleet.config import Settings, load_settings
from fleet.keys import Keys
from fleet.log import event
from fleet.state import JobStore, NodeStore, connect
from fleet.state.connection import load_scripts

log = logging.getLogger("bench.nodesim")
AGENT_ID = "nodesim"
ACTORS = {m: m.model_fields["actor"].default for m in (Launch, Stop)}


class NodeSim:
    def __init__(
        self,
        settings: Settings,
        groups: list[Group],
        *,
        consumer: str = "shared",
        threads: int = 8,
        default_s: float = 0.0,
        reconcile_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.cfg, self.clock = settings, settings.agent, clock
        keys = Keys(settings.key_prefix)
        self.jobs, self.nodes = JobStore(connect(settings), keys), NodeStore(connect(settings), keys)
        self.keys, self.bus = keys, Bus(settings)
        self._heartbeat = load_scripts(self.nodes.redis)["heartbeat"]
        self.sim_nodes = make_nodes(groups)
        self.by_queue = {n.queue: n for n in self.sim_nodes}
        self.reconcile_s = reconcile_s
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="sim")
        self.agent = SimAgent(
            settings,
            self.jobs,
            self.nodes,
            self.bus,
            stats=self.stats,
            pool=self.pool,
            stop_event=self.stop_event,
            default_s=default_s,
            clock=clock,
        )
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
        for target in (self._heartbeat_loop, self.agent.timer_loop, self._reconcile_loop):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stop_event.set()
        self.agent.wake()
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
            self._heartbeat(
                keys=self.nodes.heartbeat_keys(node.name),
                args=[AGENT_ID, ttl_ms, now, node.name, node.fields],
                client=pipe,
            )
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
            self.agent.launch(node, launch.job_id, launch.attempt)
        elif message.actor_name == ACTORS[Stop]:
            stop = Stop.model_validate(message.kwargs)
            self.agent.stop_attempt(node, stop.job_id, stop.attempt, stop.reason)
        else:
            event(log, "unknown_message", logging.WARNING, queue=queue, actor=message.actor_name)

    # -- reconcile ---------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self.stop_event.wait(self.reconcile_s):
            self._guarded(self.reconcile)

    def reconcile(self) -> None:
        """Launch what Redis placed on a node but no message delivered; end attempts a node does not
        hold (from an earlier run) as lost: the agent's own reconcile (``fleet.agent.reconcile``),
        node by node, over what Redis binds there. Redis is read before what is busy and running
        here: a launch under way while Redis is read is still busy, or already running."""
        pipe = self.nodes.redis.pipeline(transaction=False)
        for node in self.sim_nodes:
            pipe.smembers(self.keys.node_jobs(node.name))
        placed = list(zip(self.sim_nodes, pipe.execute(), strict=True))
        jobs = {j.id: j for j in self.jobs.get_many({i for _, ids in placed for i in ids})}
        busy = self.agent.known()
        for node, ids in placed:
            on_node = [jobs[i] for i in ids if i in jobs]
            todo = plan.reconcile(node.name, [], {}, on_node, busy[node.name], set())
            for job in todo.launch:
                self.pool.submit(self.agent.launch, node, job.id, job.attempt)
            for job in todo.lost:
                self.pool.submit(self.agent.lost, node, job)

    # -- reporting ---------------------------------------------------------------------

    def _guarded(self, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:
            self.stats.errors += 1
            event(log, "step_failed", logging.WARNING, step=getattr(step, "__name__", "?"), error=exc)

    def summary(self) -> dict[str, Any]:
        s = self.stats
        running, held = self.agent.running(), sum(len(n.held) for n in self.sim_nodes)
        return {
            "nodes": len(self.sim_nodes),
            "gpus": sum(len(n.gpus) for n in self.sim_nodes),
            "running": running,
            "gpus_held": held,
            "launched": s.launched,
            "finished": s.finished,
            "succeeded_jobs": len(s.succeeded),
            "succeeded_twice": sum(c > 1 for c in s.succeeded.values()),
            "members_done": s.members_done,
            "ignored": s.ignored,
            "conflicts": len(s.conflicts),
            "conflict_examples": s.conflicts[:5],
            "joined": s.joined,
            "heartbeat_rounds": s.heartbeat_rounds,
            "heartbeat_last_ms": round(s.heartbeat_last_s * 1000, 1),
            "heartbeat_max_ms": round(s.heartbeat_max_s * 1000, 1),
            "errors": s.errors,
            "consumer_rounds": getattr(self.consumer, "rounds", None),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", help="default: $FLEET_REDIS_URL")
    parser.add_argument("--nodes", type=int, default=100, help="nodes of --gpus GPUs (unless --group)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--group",
        action="append",
        type=Group.parse,
        default=[],
        help="COUNT[:GPUS[:MODEL[:PREFIX]]], repeatable; replaces --nodes",
    )
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
        summary = {
            **sim.summary(),
            "cpu_percent": round(meter.percent(), 1),
            "cpu_seconds": round(meter.last[1], 2),
            "at": time.time(),
        }
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
