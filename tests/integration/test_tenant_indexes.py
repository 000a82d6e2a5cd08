"""Queue positions and a tenant's listing come from indexes the state scripts keep: whatever happens
to jobs (submits, arrays, placements, requeues, cancels, quarantine, retention), every queued job's
place and every tenant's listing are what a full read of every job would give, and the leader
repairs indexes that lost track (an older version's jobs)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis

from fleet.keys import Keys
from fleet.models import ON_NODE_STATES, Job, JobArray, JobSpec, JobState, QueuePosition
from fleet.state import JobStore, NodeStore
from fleet.state.arrays import ArrayStore
from fleet.state.nodes import NodeInfo
from fleet.state.ranked import RankIndex
from fleet.state.retention import RetentionStore

pytestmark = pytest.mark.integration
LEADER = "ctl-test:1"
TENANTS = ("vision", "nlp", "default")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    plain = redis.Redis.from_url(redis_url, decode_responses=True)
    plain.set(Keys().leader, LEADER)
    NodeStore(plain, Keys()).heartbeat(
        "n1",
        "agent-1",
        300,
        100.0,
        NodeInfo(gpus=[], cpus=1, memory=1, runtime="process", gpu_backend="simulated"),
    )
    yield plain
    plain.close()


def expected(jobs: JobStore) -> dict[str, QueuePosition]:
    """Every queued job's place the slow way: read them all, order by priority, then submission."""
    queued = sorted(jobs.queued(), key=lambda j: (-j.spec.priority, j.seq))
    out, seen = {}, dict.fromkeys(TENANTS, 0)
    counts = {t: sum(j.spec.tenant == t for j in queued) for t in TENANTS}
    for overall, job in enumerate(queued, 1):
        seen[job.spec.tenant] += 1
        out[job.id] = QueuePosition(
            tenant=job.spec.tenant,
            in_tenant=seen[job.spec.tenant],
            tenant_queued=counts[job.spec.tenant],
            overall=overall,
            queued=len(queued),
        )
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
            jobs.transition(
                job_id,
                attempt=attempt,
                allowed=ON_NODE_STATES,
                to=JobState.QUEUED,
                reason="requeued",
                now=now,
                release=True,
            )
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
    assert heads == sorted(
        (i for i, p in where.items() if p.in_tenant <= 2), key=lambda i: (where[i].tenant, where[i].in_tenant)
    )


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


def listed(entries: list[Job | JobArray]) -> list[str]:
    return [e.id for e in entries]


def expected_listing(jobs: JobStore, tenant: str, state: JobState | None) -> list[str]:
    """A tenant's listing the slow way: every job read, arrays as one entry at their newest task."""
    everyone = jobs.get_many(jobs.redis.zrange(jobs.keys.jobs, 0, -1))
    set_aside = jobs.quarantined()  # in no state's set: listed, but under no state
    newest: dict[str, int] = {}
    for job in everyone:
        if job.spec.tenant == tenant and (state is None or (job.state == state and job.id not in set_aside)):
            entry = job.array_id or job.id
            newest[entry] = max(newest.get(entry, 0), job.seq)
    return sorted(newest, key=lambda e: -newest[e])


@pytest.mark.parametrize("state", [None, JobState.QUEUED, JobState.SCHEDULED, JobState.CANCELLED])
def test_a_tenants_listing_is_its_jobs_alone_newest_first(
    client: redis.Redis, state: JobState | None
) -> None:
    # Given jobs and arrays of three tenants that went through random changes, some deleted by retention
    jobs = JobStore(client, Keys())
    churn(jobs, random.Random(11), 250)
    cancelled = [j.id for j in jobs.list_jobs(JobState.CANCELLED, 1000)][:5]
    RetentionStore(client, Keys()).expire_jobs(
        cancelled, cutoff=1e12, now=1e12, tombstone_s=60, leader=LEADER
    )
    # Then each tenant's listing (jobs newest first, an array as one entry) is what reading all gives
    arrays = ArrayStore(jobs)
    for tenant in TENANTS:
        assert listed(arrays.listing(state, 1000, tenant)) == expected_listing(jobs, tenant, state)
        assert listed(arrays.listing(state, 3, tenant)) == expected_listing(jobs, tenant, state)[:3]
    # And what retention deleted is in no listing
    assert all(client.zscore(Keys().jobs_of(t), job_id) is None for t in TENANTS for job_id in cancelled)


def test_jobs_of_an_older_version_join_their_tenants_listing_once(client: redis.Redis) -> None:
    # Given jobs stored by a version without the tenant listings (no listing keys, no queue fields)
    jobs, keys = JobStore(client, Keys()), Keys()
    churn(jobs, random.Random(12), 150)
    for key in client.scan_iter(f"{keys.prefix}:jobs:of:*"):
        client.delete(key)
    for key in client.scan_iter(f"{keys.prefix}:*"):
        if client.type(key) == "hash":
            client.hdel(key, "queue")
    client.delete(keys.indexed)
    index = RankIndex(client, keys)
    # When the leader backfills them (once: a second call finds the marker)
    assert index.backfill() > 0 and index.backfill() == 0
    # Then every tenant's listing is complete again
    for tenant in TENANTS:
        assert listed(ArrayStore(jobs).listing(None, 1000, tenant)) == expected_listing(jobs, tenant, None)
