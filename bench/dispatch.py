"""Dispatch latency, and what an idle fleet costs Redis and its machines.

Latency: ``submit()`` returning -> the agent calling ``Runtime.start``, process runtime, one node,
jobs one after another (each waits for the previous to finish, so nothing queues behind busy
GPUs). The controller and agent run in this process, in threads, on a real redis-server and real
dramatiq, so the start call can be timed exactly on one clock.

Idle cost: a real ``fleet controller`` and ``fleet agent`` (separate processes, default settings,
simulated GPUs, nothing to do). For a few seconds MONITOR attributes every command Redis runs to
the service whose socket sent it (commands a Lua script runs count for the script's caller);
psutil gives each process's CPU and RSS. Run: ``make bench`` (or ``python -m bench.dispatch``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import cast

import psutil
import redis
from dramatiq.brokers.redis import _scripts as dramatiq_scripts

from bench.inprocess import in_process_fleet
from bench.procs import FleetProcs, job_root
from fleet.agent.runtime.base import LaunchSpec
from fleet.agent.runtime.process import ProcessRuntime
from fleet.api.backend import Backend
from fleet.client import JobHandle
from fleet.config import load_settings
from fleet.models import JobSpec, JobState
from fleet.ops.local import free_port

#: what bench/procs.py's FleetProcs speeds up; the idle services run with the defaults instead
TEST_TIMINGS = (
    "FLEET_BUS_POLL_MS",
    "FLEET_RETRY_BACKOFF_S",
    "FLEET_CONTROLLER__SCHEDULE_INTERVAL_S",
    "FLEET_CONTROLLER__LEADER_LEASE_S",
    "FLEET_AGENT__HEARTBEAT_INTERVAL_S",
    "FLEET_AGENT__NODE_LEASE_TTL_S",
    "FLEET_AGENT__FENCE_MARGIN_S",
    "FLEET_AGENT__RECONCILE_INTERVAL_S",
    "FLEET_AGENT__STOP_GRACE_S",
)


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


def latency(url: str, jobs: int, root: Path, poll_ms: int | None) -> dict[str, float]:
    settings = load_settings(
        redis_url=url,
        bus_poll_ms=poll_ms,
        checkpoint_root=root / "ckpt",
        agent={"node_name": "bench", "state_dir": root / "agent-latency", "metrics_port": 0},
        controller={"metrics_port": 0},
    )
    with in_process_fleet(settings, TimedRuntime) as (client, runtime):
        timed = cast(TimedRuntime, runtime)
        latencies = []
        spec = JobSpec(name="bench", command=["true"], gpus=1)
        for i in range(jobs + 10):
            handle = JobHandle(client, client.submit(spec).id)  # type: ignore[arg-type]
            submitted = time.time()
            with timed.event:
                timed.event.wait_for(lambda h=handle: h.id in timed.called, timeout=30)
            if i >= 10:  # warm-up
                latencies.append((timed.called[handle.id] - submitted) * 1000)
            assert handle.wait(timeout=30).state == JobState.SUCCEEDED
    latencies.sort()
    return {
        "p50": statistics.median(latencies),
        "p90": latencies[int(0.90 * len(latencies)) - 1],
        "p99": latencies[int(0.99 * len(latencies)) - 1],
        "max": latencies[-1],
    }


def idle(url: str, seconds: float, root: Path, poll_ms: int | None) -> dict[str, dict[str, float | str]]:
    """Per idle service: Redis commands/s (all, and client round trips), what they are, CPU, RSS."""
    procs = FleetProcs(url, root / "idle", "process")
    for name in TEST_TIMINGS:
        procs.env.pop(name, None)
    if poll_ms is not None:
        procs.env["FLEET_BUS_POLL_MS"] = str(poll_ms)
    procs.root.mkdir(parents=True, exist_ok=True)
    client = Backend(url)
    client._jobs.redis.flushall()
    try:
        services = {"controller": procs.controller().pid, "agent": procs.agent("idle", gpus=4).pid}
        procs.wait_nodes(client, 1)
        time.sleep(3)  # leadership, the first reconciles, connections opened
        services["agent's supervisor"] = int((procs.root / "idle" / "supervisor.pid").read_text())
        ports = redis_ports(services, url)
        cpu = {s: cpu_seconds(pid) for s, pid in services.items()}
        started = time.monotonic()
        commands = monitor(url, seconds)
        wall = time.monotonic() - started
        ports.update(redis_ports(services, url))
        used = {s: (cpu_seconds(pid) - cpu[s]) / wall for s, pid in services.items()}
        rss = {s: psutil.Process(pid).memory_info().rss / (1 << 20) for s, pid in services.items()}
    finally:
        procs.stop()
        client.close()
    return {
        s: summary(commands, {p for p, o in ports.items() if o == s}, wall)
        | {"cpu": used[s] * 100, "rss": rss[s]}
        for s in services
    }


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def redis_ports(services: dict[str, int], url: str) -> dict[int, str]:
    """Local port of every connection each service holds to Redis -> the service."""
    redis_port = int(url.rsplit(":", 1)[1].split("/")[0])
    return {
        c.laddr.port: name
        for name, pid in services.items()
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == redis_port
    }


def monitor(url: str, seconds: float) -> list[tuple[int, str]]:
    """(client port, command) of every command for ``seconds``; a Lua script's commands get the
    port of the script's caller (MONITOR shows them right after the script call)."""
    seen: list[tuple[int, str]] = []
    caller = 0
    with redis.Redis.from_url(url, socket_timeout=seconds + 5) as r, r.monitor() as m:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = m.next_command()
            if line["client_type"] != "lua":
                caller = int(line["client_port"] or 0)
            seen.append((caller, describe(line["command"], line["client_type"] == "lua")))
    return seen


TOP = 12
SCRIPTS = {
    **{hashlib.sha1(body).hexdigest(): f"dramatiq {name}" for name, body in dramatiq_scripts.items()},
    **{
        hashlib.sha1(entry.read_bytes()).hexdigest(): entry.name.removesuffix(".lua")
        for entry in (resources.files("fleet.state") / "lua").iterdir()
        if entry.name.endswith(".lua")
    },
}


def describe(command: str, in_lua: bool) -> str:
    """``EVALSHA <script> [<dramatiq command>]`` for a script call, ``lua:<NAME>`` inside one."""
    words = command.split()
    name = words[0].upper()
    if in_lua:
        return f"lua:{name}"
    if name == "EVALSHA" and len(words) > 3:
        script = SCRIPTS.get(words[1], words[1][:8])
        return f"EVALSHA {script} {words[4]}" if script == "dramatiq dispatch" else f"EVALSHA {script}"
    return name


def summary(commands: list[tuple[int, str]], ports: set[int], wall: float) -> dict[str, float | str]:
    mine = Counter(what for port, what in commands if port in ports)
    total = sum(mine.values())
    trips = sum(n for what, n in mine.items() if not what.startswith("lua:"))
    top = ", ".join(f"{what} {n / wall:.1f}" for what, n in mine.most_common(TOP))
    return {"cmds": total / wall, "trips": trips / wall, "top": top}


def machine_line(what: str) -> str:
    return (
        f"# {what}, {time.strftime('%Y-%m-%d')}, {platform.node()}: {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / (1 << 30):.0f} GiB, Python {platform.python_version()}"
    )


@contextlib.contextmanager
def redis_server(*options: str) -> Iterator[str]:
    binary = shutil.which("redis-server") or "redis-server"
    port = free_port()
    folder = tempfile.mkdtemp(prefix="fleet-bench-redis-")  # a replica's full sync writes its RDB there
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    server = subprocess.Popen([*argv, "--dir", folder, *options], stdout=subprocess.DEVNULL)
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
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def with_replica(url: str, wanted: bool) -> Iterator[None]:
    """With ``wanted``, a replica of the Redis at ``url`` (in sync before this returns), and every
    acknowledged write of the services and the benchmark waiting for it (``redis_replicas_ack``)."""
    if not wanted:
        yield
        return
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with redis_server("--replicaof", "127.0.0.1", str(port)) as replica:
        client = redis.Redis.from_url(replica, decode_responses=True)
        for _ in range(200):
            if client.info("replication").get("master_link_status") == "up":
                break
            time.sleep(0.05)
        client.close()
        os.environ["FLEET_REDIS_REPLICAS_ACK"] = "1"  # services started from here inherit it
        try:
            yield
        finally:
            del os.environ["FLEET_REDIS_REPLICAS_ACK"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=10.0, help="how long the idle services are watched")
    parser.add_argument("--poll-ms", type=int, default=None, help="bus_poll_ms (default: the setting's)")
    parser.add_argument("--replica", action="store_true", help="a replica, every acknowledged write waiting")
    args = parser.parse_args()
    root = job_root("fleet-bench-")
    with redis_server() as url, with_replica(url, args.replica):
        r = latency(url, args.jobs, root, args.poll_ms)
        print(machine_line("dispatch latency" + (", primary + replica (WAIT 1)" if args.replica else "")))
        print("| jobs | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|")
        row = " | ".join(f"{r[k]:.1f}" for k in ("p50", "p90", "p99", "max"))
        print(f"| {args.jobs} | {row} |", flush=True)
        costs = idle(url, args.idle_s, root, args.poll_ms)
    print(f"\n# idle services, watched for {args.idle_s:g} s")
    print("| service | Redis cmds/s | round trips/s | CPU % | RSS MB | commands/s |")
    print("|---|---|---|---|---|---|")
    for name, c in costs.items():
        cost = f"{c['cmds']:.1f} | {c['trips']:.1f} | {c['cpu']:.2f} | {c['rss']:.0f}"
        print(f"| {name} | {cost} | {c['top']} |")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
