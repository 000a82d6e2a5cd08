"""Job arrays at scale: submit time and Redis memory per queued job (``python -m bench.arrays``).

Starts its own ``redis-server`` (no persistence), then for each size: submits one array through
``Client.submit_array`` and, for comparison, the same number of jobs one ``Client.submit`` each
(up to 2,000: the per-job cost is flat). Memory is ``INFO memory`` ``used_memory`` before and after,
divided by the jobs created; nothing else runs on that Redis. No controller or agent: this is the
cost of the queue itself.
"""

from __future__ import annotations

import argparse
import time

import redis

from bench.dispatch import redis_server
from fleet.client import Client
from fleet.models import JobSpec

SPEC = JobSpec(name="sweep", command=["python3", "train.py", "--lr", "0.1"], gpus=1)


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def array_run(client: Client, r: redis.Redis, size: int) -> tuple[float, float]:
    r.flushdb()
    client.submit(SPEC)  # scripts loaded, connections open: time the array alone
    before = used(r)
    start = time.perf_counter()
    client.submit_array(SPEC, f"0-{size - 1}")
    seconds = time.perf_counter() - start
    return seconds, (used(r) - before) / size


def single_run(client: Client, r: redis.Redis, count: int) -> tuple[float, float]:
    r.flushdb()
    client.submit(SPEC)
    before = used(r)
    start = time.perf_counter()
    for _ in range(count):
        client.submit(SPEC)
    return (time.perf_counter() - start) / count, (used(r) - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,50000,100000")
    args = parser.parse_args()
    with redis_server() as url:
        r = redis.Redis.from_url(url)
        client = Client(url)
        print("| what | jobs | submit time | Redis bytes per queued job |")
        print("|---|---|---|---|")
        for size in map(int, args.sizes.split(",")):
            seconds, per_job = array_run(client, r, size)
            print(f"| one array | {size} | {seconds * 1000:.0f} ms | {per_job:.0f} |")
        per_submit, per_job = single_run(client, r, 2000)
        print(f"| one submit per job | 2000 | {per_submit * 1000:.2f} ms each | {per_job:.0f} |")
        client.close()


if __name__ == "__main__":
    main()
