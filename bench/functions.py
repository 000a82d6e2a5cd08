"""Functions on the fleet against plain jobs: what a call costs beyond the job that makes it.

Real processes on one Redis: ``fleet api``, ``fleet controller`` and one ``fleet agent`` (process
runtime, 16 simulated GPUs; bench/scale.py's real-agent settings), and this process as the user, a
:class:`fleet.Client` with a user's token. A trivial function, ``trivial(x) = x + 1`` defined here
(so pickled by value: run this as ``python -m bench.functions``), on 1 GPU. Measured, each on a
drained queue:

1. ``f.map(range(N), chunksize=C)`` for each N of ``--calls`` (200 and 1,000) and C of
   ``--chunksize`` (1, a task per call, and 25): first call -> last result in hand, as calls/s and
   ms of wall time per call;
2. the same number of 1-GPU ``true`` jobs through ``Client.submit_many`` (first submit -> last
   final status in hand), and ``--cli`` (200) through ``fleet submit`` (a CLI process a job);
3. one call's round trip, ``f.submit(i).result()`` one after another (``--round-trips``, 50):
   p50 and p99, beside a plain job's (``client.submit`` then ``wait``), and where the time goes:
   the median of each step from the job's history;
4. with Slurm (``bash bench/slurm.sh --run``, which starts it and runs this with ``--submitit``)
   and submitit installed (``pip install submitit``: not a fleet dependency), the same for
   submitit's ``map_array`` and ``submit(...).result()``; skipped otherwise.

``--profile-s S`` records the client, the API and the agent with py-spy during round trips (``PY_SPY``:
where py-spy is, if not on PATH).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fleet
from bench.api import SPEC, api_fleet, drain
from bench.dispatch import machine_line, redis_server
from bench.harness import REPO, Result, cpu_seconds, pythonpath
from bench.procs import FleetProcs, job_root
from fleet.api.backend import Backend
from fleet.client import Client


def trivial(x: int) -> int:
    return x + 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, nargs="+", default=[200, 1000], help="map sizes (200 1000)")
    parser.add_argument("--chunksize", type=int, nargs="+", default=[1, 25], help="calls a task (1 25)")
    parser.add_argument(
        "--cli", type=int, default=200, help="`true` jobs through `fleet submit` (200; 0: skip)"
    )
    parser.add_argument("--round-trips", type=int, default=50, help="single calls timed one by one (50)")
    parser.add_argument("--no-slurm", action="store_true", help="leave submitit on Slurm out")
    parser.add_argument("--timeout", type=float, default=600.0, help="deadline of each measurement, s")
    parser.add_argument("--profile-s", type=int, default=0, help="py-spy during round trips (0: skip)")
    parser.add_argument("--submitit", action="store_true", help="measure submitit on the running Slurm only")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if trivial.__module__ != "__main__":
        sys.exit("run it as `python -m bench.functions`: the function travels by value from __main__")
    out = Result()
    if args.submitit:
        submitit_rows(args, out)
    else:
        root = job_root("fleet-bench-functions-")
        print(machine_line("functions") + f"; load average {load()}; logs in {root}")
        print("| what | result | notes |\n|---|---|---|", flush=True)
        with redis_server() as url:
            run(args, url, root, out)
        if not args.no_slurm:
            beside_slurm(args, out)
        print(f"load average at the end: {load()}")
    if args.json:
        args.json.write_text(json.dumps({"rows": out.rows, **out.data}, indent=1))


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(args: argparse.Namespace, url: str, root: Path, out: Result) -> None:
    with api_fleet(url, root) as running:
        client, backend = running.client, running.backend
        f = fleet.function(gpus=1, python=sys.executable)(trivial).on(client)
        assert list(f.map(range(10))) == list(range(1, 11))  # warm: connections, imports, scripts
        client.submit_many([SPEC] * 10)
        drain(backend, args.timeout)
        meter = Meter(running.api.pid)
        for n in args.calls:
            for chunksize in args.chunksize:
                mapped(f, n, chunksize, out, meter)
                drain(backend, args.timeout)
            batched_jobs(client, n, out, meter)
            drain(backend, args.timeout)
        if args.cli:
            cli_jobs(running.procs, running.port, running.token, args.cli, backend, out)
            drain(backend, args.timeout)
        if args.round_trips:
            round_trips(f, client, args.round_trips, out)
        if args.profile_s:
            profile(f, [os.getpid(), running.api.pid, running.agent.pid], args.profile_s, root, out)


class Meter:
    """CPU seconds of this process (the client) and of the API: less moved by other work on the
    machine than wall time is."""

    def __init__(self, api_pid: int) -> None:
        self.api_pid = api_pid

    def read(self) -> tuple[float, float]:
        return cpu_seconds(os.getpid()), cpu_seconds(self.api_pid)

    def note(self, before: tuple[float, float], n: int) -> str:
        client, api = (b - a for a, b in zip(before, self.read(), strict=True))
        return f"CPU a call: client {client / n * 1000:.1f} ms, API {api / n * 1000:.1f} ms"


def per_call(what: str, n: int, took: float, out: Result, note: str = "", **data: Any) -> None:
    out.add(what, f"{took:.1f} s = **{n / took:.1f}/s**", f"{took / n * 1000:.0f} ms a call; {note}", **data)


def mapped(f: Any, n: int, chunksize: int, out: Result, meter: Meter) -> None:
    started, cpu = time.perf_counter(), meter.read()
    results = list(f.map(range(n), chunksize=chunksize))
    took = time.perf_counter() - started
    assert results == [i + 1 for i in range(n)], "a call returned something else"
    note = f"{meter.note(cpu, n)}; load {load()}"
    each = f", `chunksize={chunksize}`" if chunksize > 1 else ""
    key = f"map_{n}_per_s" if chunksize == 1 else f"map_{n}_chunk_{chunksize}_per_s"
    per_call(
        f"`f.map` of {n} trivial calls{each}: first call -> last result",
        n,
        took,
        out,
        note,
        **{key: n / took},
    )


def batched_jobs(client: Client, n: int, out: Result, meter: Meter) -> None:
    started, cpu = time.perf_counter(), meter.read()
    handles = [h for at in range(0, n, 500) for h in client.submit_many([SPEC] * min(500, n - at))]
    states = [h.wait(timeout=600).state.value for h in handles]
    took = time.perf_counter() - started
    assert states == ["SUCCEEDED"] * n, sorted(set(states))
    note = f"{meter.note(cpu, n)}; load {load()}"
    per_call(
        f"{n} `true` jobs, `Client.submit_many`: first submit -> last status",
        n,
        took,
        out,
        note,
        **{f"submit_many_{n}_per_s": n / took},
    )


def cli_jobs(procs: FleetProcs, port: int, token: str, n: int, backend: Backend, out: Result) -> None:
    env = {**procs.env, "FLEET_API_URL": f"http://127.0.0.1:{port}", "FLEET_TOKEN": token}
    env = {k: v for k, v in env.items() if not k.startswith("FLEET_REDIS")}
    argv = [sys.executable, "-m", "fleet", "submit", "--gpus", "1", "--", "true"]
    started = time.perf_counter()
    for _ in range(n):
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    drain(backend, 600)
    took = time.perf_counter() - started
    per_call(
        f"{n} `true` jobs, `fleet submit` each: first submit -> last final",
        n,
        took,
        out,
        f"load {load()}",
        **{f"cli_{n}_per_s": n / took},
    )


def percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[98]


def round_trips(f: Any, client: Client, count: int, out: Result) -> None:
    for what, submit, result in (
        ("trivial call's round trip, `f.submit(x).result()`", f.submit, lambda h: h.result(timeout=120)),
        (
            "`true` job's round trip, `client.submit` then `wait`",
            lambda i: client.submit(SPEC),
            lambda h: h.wait(timeout=120),
        ),
    ):
        took, steps = timed(count, submit, result)
        p50, p99 = percentiles(took)
        kind = "call" if "call" in what else "job"
        out.add(
            f"one {what}, {count} in a row",
            f"p50 **{p50 * 1000:.0f} ms**, p99 {p99 * 1000:.0f} ms",
            f"load {load()}",
            **{f"{kind}_p50_ms": p50 * 1000, f"{kind}_p99_ms": p99 * 1000},
        )
        medians = {step: statistics.median(ms) * 1000 for step, ms in steps.items()}
        out.add(
            f"where a {kind}'s round trip goes (medians)",
            ", ".join(f"{s} {m:.0f} ms" for s, m in medians.items()),
            "the client's clock, then the job's history",
            **{f"{kind}_step_{k}_ms": v for k, v in medians.items()},
        )


def timed(
    count: int, submit: Callable[[int], Any], result: Callable[[Any], Any]
) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds each ``result(submit(i))`` took, one after another, and each step's seconds."""
    took: list[float] = []
    steps: dict[str, list[float]] = {}
    for i in range(count):
        started = time.time()
        handle = submit(i)
        sent = time.time()
        result(handle)
        done = time.time()
        took.append(done - started)
        if hasattr(handle, "history"):  # a fleet job's: when it reached each state
            marks = {e.state: e.at for e in handle.history()}
            points = [("submit", started), ("sent", sent), *marks.items(), ("in hand", done)]
            for (_, a), (name, b) in itertools.pairwise(points):
                steps.setdefault(f"->{name}", []).append(b - a)
    return took, steps


def profile(f: Any, pids: list[int], seconds: int, root: Path, out: Result) -> None:
    """py-spy the client (this process), the API and the agent while calls go round one at a time."""
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        out.add("profile", "skipped", "py-spy not installed (pip install py-spy, or PY_SPY=its path)")
        return
    recorders = []
    for pid in pids:
        path = root / f"profile-{pid}.txt"
        argv = [
            spy,
            "record",
            "-d",
            str(seconds),
            "-r",
            "100",
            "-f",
            "raw",
            "-o",
            str(path),
            "--pid",
            str(pid),
        ]
        recorders.append((subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path))
    while any(r.poll() is None for r, _ in recorders):
        f.submit(0).result(timeout=120)
    out.add("profiles (py-spy raw: client, API, agent)", ", ".join(str(p) for _, p in recorders))


def beside_slurm(args: argparse.Namespace, out: Result) -> None:
    if shutil.which("slurmctld") is None:
        out.add("submitit on Slurm", "skipped", "Slurm not installed (bash bench/slurm.sh --install)")
        return
    try:
        import submitit  # noqa: F401
    except ImportError:
        out.add("submitit on Slurm", "skipped", "submitit not installed (pip install submitit)")
        return
    with tempfile.NamedTemporaryFile(suffix=".json") as found:
        argv = [
            sys.executable,
            "-m",
            "bench.functions",
            "--submitit",
            "--json",
            found.name,
            "--calls",
            *map(str, args.calls),
            "--round-trips",
            str(args.round_trips),
        ]
        env = {**os.environ, "PYTHONPATH": pythonpath()}
        # (submitit warns on each look that sacct finds no accounting storage: its result files tell)
        done = subprocess.run(
            ["bash", str(REPO / "bench" / "slurm.sh"), "--run", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        rows = json.loads(Path(found.name).read_text() or "{}").get("rows", [])
    if done.returncode != 0:
        out.add("submitit on Slurm", "failed", (done.stdout + done.stderr)[-300:].replace("\n", " "))
    for row in rows:
        out.add(*row)


def submitit_rows(args: argparse.Namespace, out: Result) -> None:
    """submitit's map_array and one call's round trip on the Slurm ``bench/slurm.sh --run`` started."""
    import submitit

    folder = Path(tempfile.mkdtemp(prefix="fleet-bench-submitit-"))
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(partition="bench", cpus_per_task=1, time=30, array_parallelism=1000)
    assert executor.submit(trivial, 0).result() == 1  # warm
    for n in args.calls:
        started = time.perf_counter()
        jobs = executor.map_array(trivial, range(n))
        results = [job.result() for job in jobs]
        took = time.perf_counter() - started
        assert results == [i + 1 for i in range(n)]
        per_call(
            f"submitit `map_array` of {n} trivial calls on Slurm: first call -> last result",
            n,
            took,
            out,
            f"load {load()}",
        )
    calls, _ = timed(args.round_trips, lambda i: executor.submit(trivial, i), lambda job: job.result())
    p50, p99 = percentiles(calls)
    out.add(
        f"submitit: one trivial call's round trip on Slurm, {args.round_trips} in a row",
        f"p50 **{p50 * 1000:.0f} ms**, p99 {p99 * 1000:.0f} ms",
        f"load {load()}; submitit looks for the result every 1 s",
    )
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
