"""Where a queued job stands, at 100,000 queued jobs (``python -m bench.positions``).

Starts its own ``redis-server``, stores ``--jobs`` QUEUED jobs of ten tenants with mixed priorities
(``JobStore.create_many``, as bench.scale does) and a 10,000-task array, then times what
``fleet show`` of a queued job and the status page's queue ask the backend: ``Backend.position``
of random queued jobs, and ``Backend.queue`` (each tenant's first 100 with their places). Both read
the rank index (``fleet.state.ranked``); before it, each read every queued job's spec.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import redis

from bench.dispatch import redis_server
from fleet.api.backend import Backend
from fleet.keys import Keys
from fleet.models import JobSpec
from fleet.state import JobStore


def seed(url: str, jobs: int) -> list[str]:
    store, rng, now = (
        JobStore(redis.Redis.from_url(url, decode_responses=True), Keys()),
        random.Random(1),
        time.time(),
    )
    batch = []
    for i in range(jobs):
        spec = JobSpec(
            name="j", command=["true"], gpus=1, priority=rng.choice((0, 0, 0, 5)), tenant=f"t{i % 10}"
        )
        batch.append((f"job-{i}", spec))
        if len(batch) == 5000:
            store.create_many(batch, now)
            batch = []
    store.create_many(batch, now)
    return [job_id for job_id, _ in batch] + [f"job-{i}" for i in range(0, jobs, 997)]


def timed(call: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with redis_server() as url:
        sample = seed(url, args.jobs)
        backend = Backend(url)
        backend.submit_array(JobSpec(name="sweep", command=["true"], gpus=1, tenant="t3"), "0-9999")
        rng = random.Random(2)
        position = timed(lambda: backend.position(rng.choice(sample)), args.runs)
        queue = timed(lambda: backend.queue(per_tenant=100), max(5, args.runs // 10))
        queued = backend.position(sample[0])
        print(f"{queued.queued if queued else 0:,} queued jobs of 10 tenants")
        print(
            f"position (fleet show): median {statistics.median(position):.2f} ms, max {max(position):.2f} ms"
        )
        print(f"queue page (100 per tenant, 1,000 jobs): median {statistics.median(queue):.1f} ms")


if __name__ == "__main__":
    main()
