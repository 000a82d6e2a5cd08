"""Job arrays at scale: submit time and Redis memory per queued job (``python -m bench.arrays``).

Starts its own ``redis-server`` (no persistence; ``--stream-node-max-bytes``, default Redis' 4096),
then for each size: submits one array through ``Backend.submit_array``, and 2,000 jobs one
``Backend.submit`` each (the per-job cost is flat). Memory is ``INFO memory`` ``used_memory`` before
and after, divided by the jobs created, with the bus DB emptied before each reading (the submit
messages wait there for a controller; none runs). Nothing else runs on that Redis: this is the
cost of the queue itself.
"""

from __future__ import annotations

import argparse
import time

import redis

from bench.dispatch import redis_server
from fleet.api.backend import Backend
from fleet.models import JobSpec

SPEC = JobSpec(name="sweep", command=["python3", "train.py", "--lr", "0.1"], gpus=1)


def used(r: redis.Redis, bus: redis.Redis) -> int:
    """Memory of the state alone: the bus DB (messages no controller consumes here) is emptied first."""
    bus.flushdb()
    return int(r.info("memory")["used_memory"])


def array_run(client: Backend, r: redis.Redis, bus: redis.Redis, size: int) -> tuple[float, float]:
    r.flushdb()
    client.submit(SPEC)  # scripts loaded, connections open: time the array alone
    before = used(r, bus)
    start = time.perf_counter()
    client.submit_array(SPEC, f"0-{size - 1}")
    seconds = time.perf_counter() - start
    return seconds, (used(r, bus) - before) / size


def single_run(client: Backend, r: redis.Redis, bus: redis.Redis, count: int) -> tuple[float, float]:
    r.flushdb()
    client.submit(SPEC)
    before = used(r, bus)
    start = time.perf_counter()
    for _ in range(count):
        client.submit(SPEC)
    return (time.perf_counter() - start) / count, (used(r, bus) - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,50000,100000", help="array sizes; '' for none")
    parser.add_argument("--stream-node-max-bytes", type=int, default=4096, help="Redis' default: 4096")
    args = parser.parse_args()
    with redis_server("--stream-node-max-bytes", str(args.stream_node_max_bytes)) as url:
        r, bus = redis.Redis.from_url(url), redis.Redis.from_url(url.rsplit("/", 1)[0] + "/1")
        client = Backend(url)
        print("| what | jobs | submit time | Redis bytes per queued job |")
        print("|---|---|---|---|")
        for size in map(int, filter(None, args.sizes.split(","))):
            seconds, per_job = array_run(client, r, bus, size)
            print(f"| one array | {size} | {seconds * 1000:.0f} ms | {per_job:.0f} |")
        per_submit, per_job = single_run(client, r, bus, 2000)
        print(f"| one submit per job | 2000 | {per_submit * 1000:.2f} ms each | {per_job:.0f} |")
        client.close()


if __name__ == "__main__":
    main()
