"""The API path users meet: submits/s and trivial jobs/s through the real HTTP API, ``sbatch`` beside it.

Real processes on one Redis: ``fleet api``, ``fleet controller`` and one ``fleet agent`` (process
runtime, 16 simulated GPUs; bench/scale.py's real-agent settings), and this process as the user, a
:class:`fleet.Client` with a user's token. Measured, each on a drained queue:

1. submits/s, one ``Client.submit`` call at a time (``--submits`` jobs, 1-GPU ``true``): with the
   jobs running as they arrive, and into a busy fleet (the node cordoned: they queue);
2. submits/s batched, ``Client.submit_many`` of ``--batch`` jobs a call;
3. end to end, ``--jobs`` 1-GPU ``true`` jobs submitted in batches: first submit -> last SUCCEEDED
   (and the same one call at a time);
4. when Slurm is installed, ``--submits`` ``sbatch --wrap true`` calls timed by bench/slurm.sh's own
   setup (``bash bench/slurm.sh --sbatch-rate N``); skipped otherwise (``--install`` installs it).

Jobs run while later ones are submitted (as for a user): submit rates include the controller and
agent working beside the API on the same cores. ``--profile-s S`` also records the API with py-spy.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from bench.dispatch import machine_line, redis_server, with_replica
from bench.harness import REPO, Result, cpu_seconds, pythonpath, until
from bench.procs import FleetProcs, job_root
from bench.scale import DEFAULTS
from fleet.api.backend import Backend
from fleet.client import Client, JobHandle
from fleet.keys import Keys
from fleet.models import JobSpec, JobState, Role
from fleet.ops.local import free_port
from fleet.state.tokens import TokenStore

SPEC = JobSpec(name="true", command=["true"], gpus=1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--submits", type=int, default=1000, help="jobs for each submit rate (default 1,000)")
    parser.add_argument("--batch", type=int, default=500, help="jobs per submit_many call (default 500)")
    parser.add_argument("--jobs", type=int, default=500, help="jobs end to end (default 500)")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of each wait, in seconds")
    parser.add_argument("--profile-s", type=int, default=0, help="py-spy the API this long (0: skip)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--replica", action="store_true", help="a replica, every acknowledged write waiting")
    args = parser.parse_args()
    root = job_root("fleet-bench-api-")
    out = Result()
    where = ", primary + replica (WAIT 1)" if args.replica else ""
    print(machine_line("api" + where) + f"; logs in {root}")
    print("| what | result | notes |\n|---|---|---|", flush=True)
    with redis_server() as url, with_replica(url, args.replica):
        run(args, url, root, out)
    if not args.replica:  # Slurm's figure does not change with fleet's Redis
        sbatch_rate(args.submits, out)
    if args.json:
        args.json.write_text(json.dumps({"rows": out.rows, **out.data}, indent=1))


@dataclass
class ApiFleet:
    """A fleet behind its API: the services' processes, a store-level view, and a user's client."""

    procs: FleetProcs
    api: subprocess.Popen[bytes]
    agent: subprocess.Popen[bytes]
    backend: Backend
    client: Client
    port: int
    token: str


@contextmanager
def api_fleet(url: str, root: Path, gpus: int = 16) -> Iterator[ApiFleet]:
    """``fleet api``, ``fleet controller`` and one agent (process runtime, ``gpus`` simulated GPUs,
    bench/scale.py's real-agent settings) on ``url``; a user's token and client. Stopped after."""
    procs = FleetProcs(url, root, "process")
    procs.env.update(DEFAULTS, PYTHONPATH=pythonpath())
    port = free_port()
    backend = Backend(url)
    try:
        api = procs.start("api", ["api", "--port", str(port), "--log-level", "warning"])
        procs.controller()
        agent = procs.agent("real-0", gpus=gpus)
        procs.wait_nodes(backend, 1, timeout=60)
        token, _ = TokenStore(redis.Redis.from_url(url, decode_responses=True), Keys()).create(
            "bench", "default", Role.USER
        )
        assert until(lambda: _listens(port), 30), "fleet api did not listen"
        with Client(f"http://127.0.0.1:{port}", token) as client:
            yield ApiFleet(procs, api, agent, backend, client, port, token)
    finally:
        procs.stop()
        backend.close()


def run(args: argparse.Namespace, url: str, root: Path, out: Result) -> None:
    with api_fleet(url, root) as fleet:
        client, backend, api = fleet.client, fleet.backend, fleet.api
        client.submit_many([SPEC] * 10)  # warm: first connection, imports, scripts loaded
        drain(backend, args.timeout)

        def one_by_one(n: int) -> list[JobHandle]:
            return [client.submit(SPEC) for _ in range(n)]

        # with the jobs running as they arrive, then into a busy fleet: no GPU free, so what is
        # submitted queues and nothing runs beside the API
        for where, key, busy in (
            ("", "one_at_a_time_per_s", False),
            (", into a busy fleet (the jobs queue)", "one_at_a_time_queued_per_s", True),
        ):
            if busy:
                backend.cordon("real-0", "bench: the submits queue")
            rate, cpu = timed_submits(client, backend, args, api.pid, one_by_one)
            out.add(
                f"submits/s, one `Client.submit` call at a time{where}",
                f"**{rate:.0f}/s**",
                f"{args.submits} jobs; {1000 / rate:.2f} ms a call; API CPU {cpu:.2f} ms a job",
                **{key: rate},
            )
            if busy:
                backend.uncordon("real-0")
            drain(backend, args.timeout)
        many = timed_submits(client, backend, args, api.pid, lambda n: batched(client, n, args.batch))
        out.add(
            f"submits/s batched, `Client.submit_many` of {args.batch}",
            f"**{many[0]:.0f}/s**",
            f"{args.submits} jobs; API CPU {many[1]:.2f} ms a job",
            batched_per_s=many[0],
        )
        drain(backend, args.timeout)
        for label, submit in (
            ("batched", lambda n: batched(client, n, args.batch)),
            ("one call at a time", one_by_one),
        ):
            end_to_end(backend, args, label, submit, out)
            drain(backend, args.timeout)
        if args.profile_s:
            profile(client, api.pid, args.profile_s, root, out)


def batched(client: Client, count: int, size: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, size):
        ids += [h.id for h in client.submit_many([SPEC] * min(size, count - start))]
    return ids


def timed_submits(
    client: Client, backend: Backend, args: argparse.Namespace, api_pid: int, submit: Callable[[int], object]
) -> tuple[float, float]:
    """(submits/s, API CPU ms per job) of ``submit(args.submits)``."""
    cpu = cpu_seconds(api_pid)
    started = time.perf_counter()
    submit(args.submits)
    took = time.perf_counter() - started
    return args.submits / took, (cpu_seconds(api_pid) - cpu) / args.submits * 1000


def end_to_end(
    backend: Backend, args: argparse.Namespace, label: str, submit: Callable[[int], list[object]], out: Result
) -> None:
    before, first = final(backend), time.time()
    ids = [getattr(h, "id", h) for h in submit(args.jobs)]
    submitted = time.time() - first
    if not until(lambda: final(backend) - before >= len(ids), args.timeout, every=0.1):
        out.add(f"{args.jobs} `true` jobs end to end, {label}", f"did not finish in {args.timeout:.0f} s")
        return
    jobs = backend._jobs.get_many(str(i) for i in ids)
    ok = sum(j.state == JobState.SUCCEEDED for j in jobs)
    last = max(j.finished_at or 0 for j in jobs)
    rate = len(ids) / (last - first)
    out.add(
        f"{args.jobs} `true` jobs end to end through the API, {label}: first submit -> last SUCCEEDED",
        f"{last - first:.1f} s = **{rate:.1f} jobs/s**",
        f"{ok} SUCCEEDED; submitting took {submitted:.1f} s",
        **{f"end_to_end_{label.split()[0]}_jobs_s": rate},
    )


def final(backend: Backend) -> int:
    counts = backend._jobs.count_by_state()
    return sum(counts[s] for s in JobState if s.final)


def drain(backend: Backend, timeout: float) -> None:
    """Every job so far final: the next measurement starts with nothing queued or running."""
    until(lambda: final(backend) >= sum(backend._jobs.count_by_state().values()), timeout, every=0.2)


def profile(client: Client, pid: int, seconds: int, root: Path, out: Result) -> None:
    """py-spy the API while one call at a time is submitted: where a submit's time goes."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        out.add("API profile", "skipped", "py-spy not installed (pip install py-spy)")
        return
    raw = root / "api.pyspy"
    rec = subprocess.Popen(
        [
            spy,
            "record",
            "--gil",
            "-d",
            str(seconds),
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(raw),
            "--pid",
            str(pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while rec.poll() is None:
        client.submit(SPEC)
    out.add("API profile (py-spy, one call at a time)", str(raw), "flame data: py-spy's raw format")


def sbatch_rate(count: int, out: Result) -> None:
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        out.add(
            "`sbatch --wrap true` calls/s", "skipped", "Slurm not installed (bash bench/slurm.sh --install)"
        )
        return
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "slurm.sh"), "--sbatch-rate", str(count)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    found = re.search(r"sbatch_per_s=([0-9.]+)", done.stdout)
    if found is None:
        out.add(
            "`sbatch --wrap true` calls/s", "failed", (done.stdout + done.stderr)[-200:].replace("\n", " ")
        )
        return
    rate = float(found.group(1))
    out.add(
        "`sbatch --wrap true` calls/s, one call at a time",
        f"**{rate:.0f}/s**",
        f"{count} calls, this run, bench/slurm.sh's setup (one node, default settings)",
        sbatch_per_s=rate,
    )


def _listens(port: int) -> bool:
    return any(
        c.laddr and c.laddr.port == port and c.status == "LISTEN" for c in psutil.net_connections("tcp")
    )


if __name__ == "__main__":
    main()
