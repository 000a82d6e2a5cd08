"""What one launch costs the node supervisor: wall time of a ``spawn`` and the supervisor's CPU.

The supervisor replaced a per-attempt Python shim that imported fleet (~0.5 CPU-s per job). This
starts a real supervisor, confirms a lease, and launches ``true`` N times in a row (each waited
for through the supervisor's exit notifications), as the process runtime does.
Run: ``python -m bench.supervisor --jobs 500`` (part of ``make bench``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

from fleet.agent.supervision import SupervisorClient


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(jobs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-sup-") as root:
        state = Path(root)
        sup = SupervisorClient(state, margin_s=0.5)
        sup.ensure()
        pid = int((state / "supervisor.pid").read_text())
        sup.lease(time.monotonic() + 3600)
        exited = threading.Condition()
        done: set[str] = set()

        def on_exit(key: str) -> None:
            with exited:
                done.add(key)
                exited.notify_all()

        stop = threading.Event()
        sup.watch(on_exit, stop)
        time.sleep(0.2)
        spawn_ms, cycle_ms = [], []
        cpu0 = cpu_seconds(pid)
        for i in range(jobs):
            key = f"bench.{i}"
            t0 = time.perf_counter()
            sup.spawn(key, ["true"], {"PATH": os.environ["PATH"]}, root, None, None)
            spawn_ms.append((time.perf_counter() - t0) * 1000)
            with exited:
                exited.wait_for(lambda k=key: k in done, timeout=10)
            cycle_ms.append((time.perf_counter() - t0) * 1000)
        cpu = cpu_seconds(pid) - cpu0
        stop.set()
        sup.shutdown()
    return {
        "jobs": jobs,
        "spawn_p50_ms": statistics.median(spawn_ms),
        "spawn_p99_ms": statistics.quantiles(spawn_ms, n=100)[98],
        "start_to_exit_seen_p50_ms": statistics.median(cycle_ms),
        "supervisor_cpu_ms_per_job": cpu / jobs * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=500)
    args = parser.parse_args()
    result = run(args.jobs)
    print(f"# supervisor launch cost, {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    for k, v in result.items():
        print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
