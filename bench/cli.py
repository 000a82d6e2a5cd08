"""Wall time of ``fleet submit`` and ``fleet jobs`` as a user runs them (``python -m bench.cli``).

Like hyperfine: each command runs ``--runs`` times after ``--warmup`` runs, as a fresh ``python -m
fleet`` process, against a ``redis-server`` of its own holding 1,000 queued jobs (and, with
``--array``, a 10,000-task array as well), through a ``fleet api`` of its own: the CLI talks HTTP
to the API, as a user's does. ``--pythonpath`` names the fleet checkout to time, and may be given
twice (e.g. ``../fleet-main`` and this one) for a before/after of two checkouts that both have the
API: the runs of the checkouts alternate, so a machine that gets busier halfway slows both alike.
Each checkout gets a Redis and an API of its own, seeded by its own code. The floor, ``python -c
pass`` (interpreter start and site), is timed too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

from bench.dispatch import redis_server
from fleet.ops.local import free_port

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "fleet submit --gpus 1 -- true": ["-m", "fleet", "submit", "--gpus", "1", "--", "true"],
    "fleet jobs": ["-m", "fleet", "jobs"],
}


@contextlib.contextmanager
def seeded_fleet(pythonpath: str, array: bool) -> Iterator[tuple[dict[str, str], str]]:
    """(the environment to run that checkout's ``fleet`` in, a working directory): its API on a fresh
    Redis holding 1,000 queued jobs (and a 10,000-task array) stored by that checkout's own code."""
    with redis_server() as url, tempfile.TemporaryDirectory(prefix="fleet-bench-cli-") as cwd:
        server_env = {**os.environ, "PYTHONPATH": pythonpath, "FLEET_REDIS_URL": url}
        code = (
            "from fleet.api.backend import Backend\nfrom fleet.keys import Keys\n"
            "from fleet.models import JobSpec, Role\nfrom fleet.state.tokens import TokenStore\n"
            f"c = Backend({url!r})\nspec = JobSpec(name='seed', command=['true'], gpus=1)\n"
            "for _ in range(1000): c.submit(spec)\n"
            + ("c.submit_array(spec, '0-9999')\n" if array else "")
            + "print(TokenStore(c.redis, Keys()).create('bench', 'default', Role.ADMIN)[0])\n"
        )
        # run from a directory holding no fleet package: `python -m` puts the working directory first
        # on sys.path, where a checkout would shadow the one --pythonpath names
        token = subprocess.run(
            [sys.executable, "-c", code], env=server_env, cwd=cwd, check=True, capture_output=True, text=True
        ).stdout.strip()
        port = free_port()
        argv = [sys.executable, "-m", "fleet", "api", "--port", str(port), "--log-level", "warning"]
        api = subprocess.Popen(argv, env=server_env, cwd=cwd)
        try:
            api_url = f"http://127.0.0.1:{port}"
            _wait_listening(api_url)
            env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
            yield {**env, "PYTHONPATH": pythonpath, "FLEET_API_URL": api_url, "FLEET_TOKEN": token}, cwd
        finally:
            api.terminate()
            api.wait()


def _wait_listening(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{url}/openapi.json", timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"fleet api at {url} did not answer")


def run_once(args: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pythonpath", action="append", help="a fleet checkout to time (default: .)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--array", action="store_true", help="also queue a 10,000-task array")
    args = parser.parse_args()
    checkouts = args.pythonpath or [os.getcwd()]
    times: dict[tuple[str, str], list[float]] = {(c, n): [] for c in checkouts for n in COMMANDS}
    with contextlib.ExitStack() as stack:
        fleets = {c: stack.enter_context(seeded_fleet(c, args.array)) for c in checkouts}
        for i in range(args.warmup + args.runs):
            for name, argv in COMMANDS.items():
                for checkout, (env, cwd) in fleets.items():
                    elapsed = run_once(argv, env, cwd)
                    if i >= args.warmup:
                        times[checkout, name].append(elapsed)
    print(
        f"{args.runs} runs after {args.warmup} warm-up runs, checkouts alternating"
        + ("; a 10,000-task array queued too" if args.array else "")
    )
    print("| checkout | command | mean ms | median ms | min ms | max ms |")
    print("|---|---|---|---|---|---|")
    for (checkout, name), t in times.items():
        print(
            f"| {checkout} | `{name}` | {statistics.mean(t):.0f} | {statistics.median(t):.0f} | "
            f"{min(t):.0f} | {max(t):.0f} |"
        )


if __name__ == "__main__":
    main()
