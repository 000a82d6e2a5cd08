"""Dispatch latency: ``submit()`` returning -> the agent calling ``Runtime.start``.

Process runtime, one node, jobs one after another (each waits for the previous to finish, so
nothing queues behind busy GPUs). The controller and agent run in this process, in threads, on a
real redis-server and real dramatiq, so the start call can be timed exactly on one clock. Also
measures what dramatiq's polling costs while idle, in Redis commands per second, for several
``bus_poll_ms`` values. Run: ``make bench`` (or ``python -m bench.dispatch --jobs 200``).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import redis

from fleet.agent.gpus import SimulatedGpus
from fleet.agent.runtime.base import LaunchSpec
from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.service import Agent
from fleet.agent.supervision import SupervisorClient
from fleet.bus import Bus
from fleet.client import Client
from fleet.config import load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.local import free_port
from fleet.models import JobSpec, JobState
from fleet.state import JobStore, NodeStore, connect


class TimedRuntime(ProcessRuntime):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.called: dict[str, float] = {}
        self.event = threading.Condition()

    def start(self, spec: LaunchSpec) -> None:
        with self.event:
            self.called[spec.job_id] = time.time()
            self.event.notify_all()
        super().start(spec)


def run_config(url: str, poll_ms: int, jobs: int, root: Path) -> dict[str, float]:
    settings = load_settings(
        redis_url=url,
        bus_poll_ms=poll_ms,
        checkpoint_root=root / "ckpt",
        agent={"node_name": "bench", "state_dir": root / f"agent-{poll_ms}"},
    )
    client_r = connect(settings)
    client_r.flushall()
    keys = Keys(settings.key_prefix)
    supervisor = SupervisorClient(settings.agent.state_dir, settings.agent.fence_margin_s)
    runtime = TimedRuntime("bench", settings.agent.state_dir / "attempts", supervisor)
    agent = Agent(
        settings,
        JobStore(connect(settings), keys),
        NodeStore(connect(settings), keys),
        Bus(settings),
        SimulatedGpus("bench", 4, "sim", 1 << 30),
        runtime,
        supervisor,
    )
    controller = Controller(
        settings, JobStore(connect(settings), keys), NodeStore(connect(settings), keys), Bus(settings)
    )
    threads = [threading.Thread(target=s.run, daemon=True) for s in (controller, agent)]
    for t in threads:
        t.start()
    client = Client(settings=settings)
    while not any(n.alive for n in client.nodes()):
        time.sleep(0.05)
    time.sleep(1)
    latencies = []
    spec = JobSpec(name="bench", command=["true"], gpus=1)
    for i in range(jobs + 10):
        handle = client.submit(spec)
        submitted = time.time()
        with runtime.event:
            runtime.event.wait_for(lambda h=handle: h.id in runtime.called, timeout=30)
        if i >= 10:  # warm-up
            latencies.append((runtime.called[handle.id] - submitted) * 1000)
        assert handle.wait(timeout=30).state == JobState.SUCCEEDED
    time.sleep(2)
    before, t0 = _counts(url), time.monotonic()
    time.sleep(5)
    after, seconds = _counts(url), time.monotonic() - t0
    idle, scripts = ((a - b) / seconds for a, b in zip(after, before, strict=True))
    agent.stop_event.set()
    controller.stop_event.set()
    controller._wake.set()
    for t in threads:
        t.join(timeout=10)
    latencies.sort()
    return {
        "poll_ms": poll_ms,
        "jobs": jobs,
        "p50": statistics.median(latencies),
        "p90": latencies[int(0.90 * len(latencies)) - 1],
        "p99": latencies[int(0.99 * len(latencies)) - 1],
        "max": latencies[-1],
        "idle_cmds": idle,
        "idle_scripts": scripts,
    }


def _counts(url: str) -> tuple[int, int]:
    """(all commands, including those run inside Lua scripts; script calls, i.e. client round trips)."""
    r = redis.Redis.from_url(url)
    stats = r.info("commandstats")
    scripts = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    total = int(r.info("stats")["total_commands_processed"])
    r.close()
    return total, scripts


def machine_line(what: str) -> str:
    return (
        f"# {what}, {time.strftime('%Y-%m-%d')}, {platform.node()}: {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / (1 << 30):.0f} GiB, Python {platform.python_version()}"
    )


@contextlib.contextmanager
def redis_server(*options: str) -> Iterator[str]:
    binary = shutil.which("redis-server") or "redis-server"
    port = free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no", *options],
                              stdout=subprocess.DEVNULL)  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--polls", default="10,20,50,100,1000", help="bus_poll_ms values to compare")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    print(machine_line("dispatch latency"))
    print(
        "| bus_poll_ms | jobs | p50 ms | p90 ms | p99 ms | max ms | idle cmds/s | of which script calls/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with redis_server() as url:
        for poll in (int(p) for p in args.polls.split(",")):
            jobs = args.jobs if poll <= 100 else min(args.jobs, 50)
            r = run_config(url, poll, jobs, root)
            print(
                f"| {poll} | {jobs} | {r['p50']:.1f} | {r['p90']:.1f} | {r['p99']:.1f} | {r['max']:.1f} "
                f"| {r['idle_cmds']:.0f} | {r['idle_scripts']:.0f} |",
                flush=True,
            )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
