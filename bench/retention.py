"""Redis memory under retention: what a job costs, and that memory returns to the empty fleet's.

Two runs on a real ``redis-server``, with the real controller (leader lease, scheduling pass,
reconcile and the retention pass) running in this process on a real dramatiq bus:

1. **cost**: bytes of Redis memory (``INFO memory`` ``used_memory``) per queued job, per finished
   job with its events and logs, and per tombstone of a deleted job. The controller's clock is
   moved past the retention to delete the jobs at a chosen moment.
2. **flow**: many short jobs through a fleet whose ``job_retention_s`` and
   ``tombstone_retention_s`` are a minute; memory sampled every second; at the end, with every
   job and tombstone gone, memory compared with the empty fleet's (target: within 10%).

Redis runs with the memory settings of ``config/redis.conf`` (``maxmemory``, its policy and
``stream-node-max-bytes``; ``--stream-node-max-bytes 4096`` shows Redis' default). Jobs do not run
as processes: fleet runs only a few to a few tens of jobs a second end to end on
a small machine, so a driver thread moves each job through the store operations an agent uses
(``JobStore.create``, ``place`` fenced by the controller's token, ``transition`` to STARTING and
RUNNING, ``append_logs``, ``end_attempt``), i.e. the same Lua scripts, as fast as Redis answers.
Run: ``python -m bench.retention`` (``make bench``), ``--jobs 100000`` by default.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.dispatch import machine_line, redis_server
from fleet.bus import Bus
from fleet.config import Settings, load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.lifecycle import RetryPolicy, decide
from fleet.models import Exit, Gpu, JobSpec, JobState
from fleet.state import JobStore, NodeStore, connect
from fleet.state.nodes import NodeInfo

NODE, GPUS = "bench", 8
REDIS_CONF = Path(__file__).resolve().parent.parent / "config" / "redis.conf"
MEMORY_DIRECTIVES = ("maxmemory", "maxmemory-policy", "stream-node-max-bytes")
#: a spec the scheduler never places (the driver places each job itself), so the controller's
#: passes do not race the driver
SPEC = JobSpec(name="bench", command=["python", "train.py"], gpus=1, gpu_model="driver-placed")
POLICY = RetryPolicy()


def memory_options(overrides: dict[str, str]) -> list[str]:
    """``redis-server`` options for the memory directives of config/redis.conf, with ``overrides``."""
    found = {}
    for line in REDIS_CONF.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name in MEMORY_DIRECTIVES:
            found[name] = value.strip()
    return [part for name, value in {**found, **overrides}.items() for part in (f"--{name}", value)]


def log_lines(count: int) -> list[tuple[str, str]]:
    return [
        (f"c{i}", f"step {i:05d} loss 0.{i:04d} lr 0.001 throughput 1234.5 samples/s") for i in range(count)
    ]


@dataclass
class Clock:
    offset: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class Fleet:
    """A controller (thread) and a heartbeating node, over one Redis."""

    settings: Settings
    clock: Clock = field(default_factory=Clock)

    def __post_init__(self) -> None:
        keys = Keys(self.settings.key_prefix)
        self.redis = connect(self.settings)
        self.jobs = JobStore(connect(self.settings), keys)
        self.nodes = NodeStore(connect(self.settings), keys)
        self.controller = Controller(
            self.settings,
            JobStore(connect(self.settings), keys),
            NodeStore(connect(self.settings), keys),
            Bus(self.settings),
            clock=self.clock,
        )
        self.stop = threading.Event()
        gpus = [Gpu(uuid=f"{NODE}-g{i}", index=i, model="sim", memory_total=1 << 30) for i in range(GPUS)]
        self.info = NodeInfo(gpus=gpus, cpus=2, memory=1 << 30, runtime="process", gpu_backend="simulated")
        self.threads = [
            threading.Thread(target=self.controller.run, daemon=True),
            threading.Thread(target=self._heartbeat, daemon=True),
        ]

    def __enter__(self) -> Fleet:
        for t in self.threads:
            t.start()
        until(lambda: bool(self.controller.lease.value) and bool(self.nodes.all()), "leader and node")
        time.sleep(3)  # a few passes of every loop: scripts loaded, bus keys made
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.controller.stop_event.set()
        self.controller._wake.set()
        for t in self.threads:
            t.join(timeout=10)

    def _heartbeat(self) -> None:
        while not self.stop.wait(1.0):
            self.nodes.heartbeat(NODE, "bench-agent", 10, time.time(), self.info)

    def memory(self) -> int:
        return int(self.redis.info("memory")["used_memory"])

    def run_job(self, job_id: str, lines: list[tuple[str, str]]) -> None:
        """One short job's life, through the agent's store operations."""
        jobs, now = self.jobs, time.time()
        jobs.create(job_id, SPEC, now)
        gpu = f"{NODE}-g{hash(job_id) % GPUS}"
        attempt = jobs.place(job_id, NODE, [gpu], self.controller.lease.value, now, f"placed on {NODE}")
        assert attempt, f"placement of {job_id} refused"
        jobs.transition(
            job_id,
            attempt=attempt,
            allowed=[JobState.SCHEDULED],
            to=JobState.STARTING,
            reason=f"starting on {NODE}",
            now=now,
        )
        jobs.transition(
            job_id,
            attempt=attempt,
            allowed=[JobState.STARTING],
            to=JobState.RUNNING,
            reason=f"running on {NODE}",
            now=now,
            fields={"started_at": now},
        )
        if lines:
            jobs.append_logs(job_id, attempt, lines, self.settings.log_max_lines)
        job, exit = jobs.get(job_id), Exit(code=0, reason="exited 0")
        jobs.end_attempt(job, exit, decide(job, exit, POLICY), time.time(), {"checkpoint": None})


def until(condition: Callable[[], bool], what: str, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def settled(fleet: Fleet, seconds: float = 3.0) -> int:
    """Memory once the serverCron has shrunk emptied tables (it runs every 100 ms)."""
    time.sleep(seconds)
    return fleet.memory()


def settings(url: str, retention: float, tombstone: float) -> Settings:
    return load_settings(
        redis_url=url,
        job_retention_s=retention,
        tombstone_retention_s=tombstone,
        controller={"metrics_port": 0, "retention_interval_s": 1.0},
    )


def cost(url: str, count: int, lines: int) -> dict[str, float]:
    """Bytes per queued job, per finished job (5 events, ``lines`` log lines), per tombstone."""
    redis.Redis.from_url(url).flushall()
    with Fleet(settings(url, retention=3600, tombstone=3600)) as fleet:
        empty = settled(fleet)
        for i in range(count):
            fleet.jobs.create(f"queued-{i}", SPEC, time.time())
        queued = settled(fleet)
        for i in range(count):
            fleet.jobs.request_cancel(f"queued-{i}", time.time())
        cancelled = settled(fleet)
        for i in range(count):
            fleet.run_job(f"done-{i}", log_lines(lines))
        finished = settled(fleet)
        fleet.clock.offset = 3601  # past the retention: the next pass deletes them all
        until(lambda: fleet.redis.zcard(Keys().ended) == 0, "every job deleted")
        tombstones = settled(fleet)
    return {
        "empty": empty,
        "queued": (queued - empty) / count,
        "finished": (finished - cancelled) / count,
        "tombstone": (tombstones - empty) / (2 * count),
    }


@dataclass
class Sampler:
    fleet: Fleet
    peak: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.peak = max(self.peak, self.fleet.memory())


def flow(url: str, count: int, lines: int, retention: float) -> dict[str, float]:
    """``count`` jobs through a fleet with a retention (and tombstones) of ``retention`` seconds."""
    redis.Redis.from_url(url).flushall()
    with Fleet(settings(url, retention=retention, tombstone=retention)) as fleet:
        empty_keys, empty = fleet.redis.dbsize(), settled(fleet)
        sampler = Sampler(fleet)
        threading.Thread(target=sampler.run, daemon=True).start()
        start = time.monotonic()
        for i in range(count):
            fleet.run_job(f"job-{i}", log_lines(lines))
        elapsed = time.monotonic() - start
        # every job deleted, then every tombstone expired: only the submission counter is new
        until(lambda: fleet.redis.dbsize() <= empty_keys + 1, "back to the empty fleet's keys")
        drained = time.monotonic() - start
        after = settled(fleet, 5.0)
        sampler.stop.set()
    return {
        "empty": empty,
        "peak": sampler.peak,
        "after": after,
        "rate": count / elapsed,
        "drained": drained,
        "elapsed": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the flow run (0: no flow run)")
    parser.add_argument("--cost-jobs", type=int, default=10_000, help="jobs per kind in the cost run")
    parser.add_argument("--log-lines", type=int, default=20, help="log lines each job ships")
    parser.add_argument("--retention", type=float, default=60.0, help="job and tombstone retention, s")
    parser.add_argument("--stream-node-max-bytes", help="instead of config/redis.conf's")
    args = parser.parse_args()
    overrides = {"stream-node-max-bytes": args.stream_node_max_bytes} if args.stream_node_max_bytes else {}
    options = memory_options(overrides)
    print(machine_line("retention and memory"), "; redis-server", " ".join(options))
    with redis_server(*options) as url:
        c = cost(url, args.cost_jobs, args.log_lines)
        print(f"| empty fleet | {c['empty'] / 1e6:.2f} MB |")
        print(f"| per queued job | {c['queued']:.0f} B |")
        print(f"| per finished job (5 events, {args.log_lines} log lines of 60 B) | {c['finished']:.0f} B |")
        print(f"| per tombstone of a deleted job | {c['tombstone']:.0f} B |", flush=True)
        if not args.jobs:
            return
        f = flow(url, args.jobs, args.log_lines, args.retention)
        print(
            f"| flow: jobs | {args.jobs} in {f['elapsed']:.0f} s ({f['rate']:.0f} jobs/s), all deleted "
            f"and tombstones expired after {f['drained']:.0f} s |"
        )
        change = (f["after"] - f["empty"]) / f["empty"]
        print(
            f"| flow: memory empty / peak / after | {f['empty'] / 1e6:.2f} / {f['peak'] / 1e6:.1f} / "
            f"{f['after'] / 1e6:.2f} MB ({change:+.1%} vs empty) |"
        )


if __name__ == "__main__":
    main()
