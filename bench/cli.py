"""Wall time of ``fleet submit`` and ``fleet jobs`` as a user runs them (``python -m bench.cli``).

Like hyperfine: each command runs ``--runs`` times in a row after ``--warmup`` runs, as a fresh
``python -m fleet`` process against its own ``redis-server``, which holds 1,000 queued jobs (and,
with ``--array``, a 10,000-task array as well). ``--pythonpath`` picks the fleet code to time, so
the same script times an older checkout (e.g. ``/work/main``) for a before/after. The floor is
``python -c pass`` (interpreter start and site), also timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench.dispatch import redis_server


def seed(url: str, pythonpath: str, array: bool) -> None:
    """Queue 1,000 jobs (and a 10,000-task array) with the fleet code under test."""
    code = (
        "from fleet.client import Client\n"
        "from fleet.models import JobSpec\n"
        f"c = Client({url!r})\n"
        "spec = JobSpec(name='seed', command=['true'], gpus=1)\n"
        "for _ in range(1000): c.submit(spec)\n" + ("c.submit_array(spec, '0-9999')\n" if array else "")
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": pythonpath}, check=True)


def timed(argv: list[str], env: dict[str, str], runs: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr}")
        if i >= warmup:
            times.append(elapsed * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pythonpath", default=os.getcwd(), help="the fleet checkout to time")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--array", action="store_true", help="also queue a 10,000-task array")
    args = parser.parse_args()
    with redis_server() as url:
        seed(url, args.pythonpath, args.array)
        env = {**os.environ, "PYTHONPATH": args.pythonpath, "FLEET_REDIS_URL": url}
        fleet = [sys.executable, "-m", "fleet"]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "fleet submit --gpus 1 -- true": [*fleet, "submit", "--gpus", "1", "--", "true"],
            "fleet jobs": [*fleet, "jobs"],
        }
        print(f"fleet code: {args.pythonpath}; {args.runs} runs after {args.warmup} warm-up runs")
        print("| command | mean ms | median ms | min ms | max ms |")
        print("|---|---|---|---|---|")
        for name, argv in commands.items():
            t = timed(argv, env, args.runs, args.warmup)
            print(f"| `{name}` | {statistics.mean(t):.0f} | {statistics.median(t):.0f} | {min(t):.0f} | "
                  f"{max(t):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
