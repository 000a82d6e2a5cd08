"""Webhooks: how soon a job's end reaches its receiver, and that a slow receiver does not slow the
fleet down (deliveries run on the leader's sender threads, never in a scheduling pass).

A controller and an agent run in this process, in threads (process runtime, 4 simulated GPUs), on a
real redis-server, with the default webhook settings (``webhook_interval_s`` 1 s, 4 threads, 10 s
timeout). A local HTTP server receives the POSTs.

- latency: a job's ``finished_at`` -> its POST arriving (jobs one after another)
- throughput: ``--jobs`` 1-GPU jobs of ``true`` submitted at once, until all SUCCEEDED: without a
  webhook, then with every job notifying a receiver that takes 5 s to answer each POST

Run: ``python -m bench.webhooks`` (needs redis-server).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.inprocess import in_process_fleet
from bench.procs import job_root
from fleet.api.backend import Backend
from fleet.config import Settings, load_settings
from fleet.models import JobSpec, JobState
from fleet.ops.local import free_port


@contextmanager
def receiver(delay_s: float) -> Iterator[tuple[str, dict[str, float]]]:
    """A server answering 200 after ``delay_s``; job id -> when its POST arrived."""
    arrived: dict[str, float] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.setdefault(self.path.rsplit("/", 1)[-1], time.time())
            time.sleep(delay_s)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", arrived
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def fleet(url: str, root: Path) -> Iterator[Backend]:
    settings: Settings = load_settings(
        redis_url=url,
        checkpoint_root=root / "ckpt",
        agent={"node_name": "bench", "state_dir": root / "agent", "metrics_port": 0, "cpus": 64},
        controller={"metrics_port": 0},
    )
    with in_process_fleet(settings) as (client, _):
        yield client


def latency(client: Backend, jobs: int) -> dict[str, float]:
    with receiver(0.0) as (url, arrived):
        lags = []
        for i in range(jobs):
            job = client.submit(JobSpec(name="lat", command=["true"], gpus=1, notify=f"{url}/{i}"))
            done = client.wait(job.id, timeout=60)
            deadline = time.monotonic() + 30
            while str(i) not in arrived and time.monotonic() < deadline:
                time.sleep(0.01)
            lags.append((arrived[str(i)] - (done.finished_at or 0)) * 1000)
    lags.sort()
    return {"p50": statistics.median(lags), "p90": lags[int(0.9 * len(lags)) - 1], "max": lags[-1]}


def throughput(client: Backend, jobs: int, url: str | None) -> float:
    started = time.monotonic()
    ids = [
        client.submit(JobSpec(name="tp", command=["true"], gpus=1, notify=f"{url}/{i}" if url else None)).id
        for i in range(jobs)
    ]
    for job_id in ids:
        assert client.wait(job_id, timeout=300).state == JobState.SUCCEEDED
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    assert binary, "redis-server not installed"
    port, root = free_port(), job_root("fleet-bench-webhooks-")
    redis_proc = subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    url = f"redis://127.0.0.1:{port}/0"
    time.sleep(0.5)
    try:
        with fleet(url, root / "lat") as client:
            lag = latency(client, 20)
        bare, slow, notified = [], [], []
        for run in range(args.runs):  # interleaved: the machine's load changes under both alike
            with fleet(url, root / f"bare{run}") as client:
                bare.append(throughput(client, args.jobs, None))
            with receiver(5.0) as (slow_url, arrived), fleet(url, root / f"slow{run}") as client:
                slow.append(throughput(client, args.jobs, slow_url))
                notified.append(len(arrived))
    finally:
        redis_proc.terminate()
        redis_proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    print(f"# webhooks ({platform.python_version()}, {platform.machine()})")
    print(
        f"job end -> POST received (20 jobs, webhook_interval_s 1): p50 {lag['p50']:.0f} ms, "
        f"p90 {lag['p90']:.0f} ms, max {lag['max']:.0f} ms"
    )
    print(
        f"{args.jobs} jobs submitted at once, until all SUCCEEDED, {args.runs} runs each: without webhooks "
        f"median {statistics.median(bare):.1f} s ({', '.join(f'{t:.1f}' for t in bare)}); each job notifying "
        f"a receiver that answers in 5 s median {statistics.median(slow):.1f} s "
        f"({', '.join(f'{t:.1f}' for t in slow)}; {min(notified)}-{max(notified)} POSTs answered by then)"
    )


if __name__ == "__main__":
    main()
