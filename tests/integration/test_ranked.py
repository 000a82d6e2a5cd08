"""Queue positions come from an index the state scripts keep: whatever happens to jobs (submits,
arrays, placements, requeues, cancels, quarantine), every queued job's place is the one a full read
of the queue would give, and the leader repairs an index that lost track (an older version's jobs)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis

from fleet.keys import Keys
from fleet.models import ON_NODE_STATES, JobSpec, JobState, QueuePosition
from fleet.state import JobStore, NodeStore
from fleet.state.arrays import ArrayStore
from fleet.state.nodes import NodeInfo
from fleet.state.ranked import RankIndex

pytestmark = pytest.mark.integration
LEADER = "ctl-test:1"
TENANTS = ("vision", "nlp", "default")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    plain = redis.Redis.from_url(redis_url, decode_responses=True)
    plain.set(Keys().leader, LEADER)
    NodeStore(plain, Keys()).heartbeat("n1", "agent-1", 300, 100.0, NodeInfo(
        gpus=[], cpus=1, memory=1, runtime="process", gpu_backend="simulated"))  # fmt: skip
    yield plain
    plain.close()


def expected(jobs: JobStore) -> dict[str, QueuePosition]:
    """Every queued job's place the slow way: read them all, order by priority, then submission."""
    queued = sorted(jobs.queued(), key=lambda j: (-j.spec.priority, j.seq))
    out, seen = {}, dict.fromkeys(TENANTS, 0)
    counts = {t: sum(j.spec.tenant == t for j in queued) for t in TENANTS}
    for overall, job in enumerate(queued, 1):
        seen[job.spec.tenant] += 1
        out[job.id] = QueuePosition(tenant=job.spec.tenant, in_tenant=seen[job.spec.tenant],
                                    tenant_queued=counts[job.spec.tenant], overall=overall,
                                    queued=len(queued))  # fmt: skip
    return out


def churn(jobs: JobStore, rng: random.Random, steps: int) -> None:
    """Random submits, array batches, placements, requeues, cancels and a quarantine or two."""
    arrays, on_node, now = ArrayStore(jobs), [], 100.0
    for step in range(steps):
        now += 1
        roll = rng.random()
        queued = jobs.queued_ids()
        if roll < 0.35 or not queued:
            spec = JobSpec(
                name="j", command=["true"], priority=rng.choice((0, 0, 5, -3)), tenant=rng.choice(TENANTS)
            )
            jobs.create(f"j{step}", spec, now)
        elif roll < 0.45:
            spec = JobSpec(
                name="a", command=["true"], priority=rng.choice((0, 2)), tenant=rng.choice(TENANTS)
            )
            arrays.create(f"a{step}", spec, tuple(range(rng.randint(1, 5))), None, now)
        elif roll < 0.65:
            job_id = rng.choice(queued)
            if jobs.place(job_id, "n1", [], LEADER, now, "placed on n1"):
                on_node.append(job_id)
        elif roll < 0.8 and on_node:
            job_id = on_node.pop(rng.randrange(len(on_node)))
            attempt = jobs.get(job_id).attempt
            jobs.transition(job_id, attempt=attempt, allowed=ON_NODE_STATES, to=JobState.QUEUED,
                            reason="requeued", now=now, release=True)  # fmt: skip
        elif roll < 0.95:
            jobs.request_cancel(rng.choice(queued), now)
        else:
            jobs.quarantine(rng.choice(queued), "unreadable", now, LEADER)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_queued_jobs_place_is_what_reading_the_whole_queue_gives(
    client: redis.Redis, seed: int
) -> None:
    # Given a queue that went through a few hundred random changes
    jobs = JobStore(client, Keys())
    churn(jobs, random.Random(seed), 300)
    # Then the index gives each queued job the place a full read gives, and none to the others
    index = RankIndex(client, Keys())
    everyone = [j for j in client.zrange(Keys().jobs, 0, -1)]
    assert index.positions(everyone) == expected(jobs)
    assert index.repair() == 0  # nothing to put right
    # And the queue page's heads are each tenant's first jobs, in order
    where = expected(jobs)
    heads = index.heads(None, 2)
    assert heads == sorted((i for i, p in where.items() if p.in_tenant <= 2),
                           key=lambda i: (where[i].tenant, where[i].in_tenant))  # fmt: skip


def test_the_leader_repairs_an_index_that_lost_track_of_jobs(client: redis.Redis) -> None:
    # Given queued jobs stored by a version without the index (no index keys, no rank fields)
    jobs, keys = JobStore(client, Keys()), Keys()
    churn(jobs, random.Random(7), 120)
    for key in client.scan_iter(f"{keys.prefix}:queue:*"):
        client.delete(key)
    for job_id in jobs.queued_ids():
        client.zadd(keys.queued, {job_id: jobs.get(job_id).seq})
    for key in client.scan_iter(f"{keys.prefix}:*"):
        if client.type(key) == "hash":
            client.hdel(key, "queue")
    index = RankIndex(client, keys)
    assert index.positions(jobs.queued_ids()) == {}
    # When the leader's resync repairs it
    fixed = index.repair()
    # Then every queued job has its place again, and later changes keep it right
    assert fixed == len(jobs.queued_ids()) > 0
    assert index.positions(jobs.queued_ids()) == expected(jobs)
    churn(jobs, random.Random(8), 60)
    assert index.positions(client.zrange(keys.jobs, 0, -1)) == expected(jobs)
    # And a tenant's queue that lost a job or holds one no longer queued is put right as well
    lost, tenant = jobs.queued()[0].id, jobs.queued()[0].spec.tenant
    client.zrem(keys.queued_in(tenant), lost)
    assert index.repair() == 1
    client.zadd(keys.queued_in(tenant), {"gone-long-ago": 1 << 41})
    assert index.repair() == 1
    assert index.positions(client.zrange(keys.jobs, 0, -1)) == expected(jobs)
    assert client.zscore(keys.queued_in(tenant), "gone-long-ago") is None
