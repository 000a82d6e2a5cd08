"""Nothing grows forever: ended jobs, their history and logs, gone nodes and their bus queues, and
expired jobs' checkpoint directories are deleted after their retention; memory returns to baseline.

The first tests run the controller in this process with a clock the test sets, so "ended longer ago
than the retention" is exact; the last runs the real services and the CLI with a 1 s retention.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis as redis_py

from fleet import Client, JobSpec, JobState
from fleet.bus import Stop, node_queue
from fleet.errors import JobExpired, NotFound, SpecError
from fleet.keys import Keys
from fleet.lifecycle import RetryPolicy, decide
from fleet.models import Exit
from fleet.state.arrays import ArrayStore
from fleet.state.blobs import BlobStore
from fleet.state.connection import connect_binary
from fleet.state.retention import RetentionStore
from fleet.state.stdin import StdinStreams
from fleet.workdir import digest_of
from tests.conftest import Api, FleetProcs
from tests.integration.inprocess import Harness, info
from tests.support import wait_for

pytestmark = pytest.mark.integration
DAY = 86400.0
K = Keys()


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def harness(redis_url: str, clock: Clock) -> Iterator[Harness]:
    h = Harness(redis_url, clock, job_retention_s=60, tombstone_retention_s=600, node_retention_s=7 * DAY)
    assert h.controller.lease.renew()
    yield h
    h.close()


def run_attempt(h: Harness, job_id: str, code: int | None, at: float) -> None:
    """Place the job on node n, start it, ship a log line, and end it with ``code`` at ``at``
    (None: leave it running)."""
    leader = h.controller.lease.value
    attempt = h.jobs.place(job_id, "n", ["n-g0"], leader, at - 30, "placed")
    assert attempt
    for to in (JobState.STARTING, JobState.RUNNING):
        h.jobs.transition(
            job_id,
            attempt=attempt,
            allowed=[JobState.SCHEDULED, JobState.STARTING],
            to=to,
            reason="",
            now=at - 20,
        )
    h.jobs.append_logs(job_id, attempt, [("c1", f"attempt {attempt} says hi")], 100)
    if code is not None:
        job, exit = h.jobs.get(job_id), Exit(code=code, reason=f"exited {code}")
        h.jobs.end_attempt(job, exit, decide(job, exit, RetryPolicy(0)), at)


def submit(h: Harness, job_id: str, at: float, **spec: object) -> None:
    h.jobs.create(job_id, JobSpec(name="j", command=["true"], gpus=1, **spec), at)  # type: ignore[arg-type]


def job_keys(h: Harness, job_id: str) -> list[str]:
    return sorted(h.client.scan_iter(match=f"fleet:job:{job_id}:*")) + sorted(
        h.client.scan_iter(match=f"fleet:job:{job_id}")
    )


def test_retention_deletes_exactly_the_jobs_that_ended_longer_ago_than_the_retention(
    harness: Harness, clock: Clock, client: Client
) -> None:
    h, now = harness, clock.now
    h.node("n")
    # Given (retention 60 s) a job that succeeded 2 minutes ago, one cancelled while queued 61 s ago,
    # one that failed twice (logs of attempts 1 and 2) ending 100 s ago, one that succeeded 59 s ago,
    # one running for 20 minutes and one queued for 20 minutes
    for job_id in ("old-ok", "old-cancel", "old-failed", "recent", "running", "queued"):
        submit(h, job_id, now - 1200, max_attempts=2)
    run_attempt(h, "old-ok", 0, now - 120)
    h.jobs.request_cancel("old-cancel", now - 61)
    StdinStreams(h.client, h.jobs.keys).put("old-cancel", b"forwarded stdin never read\n")
    run_attempt(h, "old-failed", 1, now - 200)
    run_attempt(h, "old-failed", 1, now - 100)
    run_attempt(h, "recent", 0, now - 59)
    run_attempt(h, "running", None, now - 1200)
    # When the controller's retention pass runs
    deleted = h.controller.expire()
    # Then the three jobs that ended more than 60 s ago are gone, record, history, every
    # attempt's logs and input left unread, leaving only a tombstone each
    assert deleted == 3
    for job_id in ("old-ok", "old-cancel", "old-failed"):
        assert job_keys(h, job_id) == [f"fleet:job:{job_id}:expired"]
    # And whoever asks for one is told it expired, how it ended and when, as a NotFound
    with pytest.raises(JobExpired) as expired:
        client.get("old-ok")
    assert str(expired.value) == str(JobExpired("old-ok", "SUCCEEDED", now - 120, now))
    with pytest.raises(JobExpired, match=r"it ended FAILED at .* logs were deleted at"):
        client.history("old-failed")
    with pytest.raises(JobExpired, match="it ended CANCELLED"):
        client.logs("old-cancel")
    # And the others are untouched: listed, with their state, history and logs
    assert sorted(j.id for j in client.jobs()) == ["queued", "recent", "running"]
    assert [client.get(j).state for j in ("queued", "recent", "running")] == [
        JobState.QUEUED,
        JobState.SUCCEEDED,
        JobState.RUNNING,
    ]
    assert [line.line for line in client.logs("recent")] == ["attempt 1 says hi"]
    assert [e.state for e in client.history("running")][-1] == "RUNNING"
    counts = {s: c for s, c in h.jobs.count_by_state().items() if c}
    assert counts == {JobState.QUEUED: 1, JobState.RUNNING: 1, JobState.SUCCEEDED: 1}
    # And the id of an expired job cannot be taken by a new job while its tombstone lasts
    with pytest.raises(SpecError, match=r"'old-ok' expired: .*choose another id"):
        client.submit(JobSpec(name="again", command=["true"]), job_id="old-ok")
    client.close()
    # And once the recent job is old enough too, the next pass deletes it
    clock.now += 2
    assert h.controller.expire() == 1
    with pytest.raises(JobExpired):
        h.jobs.get("recent")


def test_jobs_that_ended_before_fleet_had_retention_are_deleted_too(harness: Harness, clock: Clock) -> None:
    h, now = harness, clock.now
    h.node("n")
    # Given a job that ended a day ago under a fleet version without retention (not in the ended index)
    submit(h, "legacy", now - DAY)
    run_attempt(h, "legacy", 0, now - DAY + 60)
    h.client.zrem(K.ended, "legacy")
    # When a controller leads and runs its retention pass
    h.controller.expire()
    # Then the job is deleted as any other
    with pytest.raises(JobExpired, match="it ended SUCCEEDED"):
        h.jobs.get("legacy")


def test_a_node_gone_for_the_retention_is_removed_with_its_bus_queue(
    harness: Harness, clock: Clock, client: Client
) -> None:
    h, now = harness, clock.now
    bus = h.bus.broker.client
    # Given a node whose last heartbeat was 8 days ago, one gone as long that still holds a job,
    # one gone for a day, and a live one; each with a message waiting in its bus queue
    for name, seen in (("gone", now - 8 * DAY), ("gone-busy", now - 8 * DAY), ("gone-1d", now - DAY)):
        h.nodes.heartbeat(name, f"agent-{name}", 60, seen, info(name))
        h.client.delete(K.node_lease(name))
    h.node("live")
    submit(h, "stuck", now - 9 * DAY)
    h.client.sadd(K.node_jobs("gone-busy"), "stuck")
    for name in ("gone", "gone-busy", "gone-1d", "live"):
        h.bus.send(node_queue(name), Stop(job_id="j", attempt=1, reason="test"))
    # And the gone node's queue holds a dead letter and messages a dead agent fetched and never acked
    queue = f"fleet:{node_queue('gone')}"
    bus.zadd(f"{queue}.XQ", {"dead-1": 1})
    bus.hset(f"{queue}.XQ.msgs", "dead-1", b"{}")
    bus.sadd(f"fleet:__acks__.0b7c4d3e-dead-agent.{node_queue('gone')}", "m-1")
    bus.sadd(f"fleet:__acks__.0b7c4d3e-dead-agent.{node_queue('gone')}.other", "m-2")  # not its queue
    # When the controller's retention pass runs (node retention: 7 days)
    h.controller.expire()
    # Then the empty node gone for 8 days is no longer known, and the others are
    assert sorted(n.name for n in client.nodes()) == ["gone-1d", "gone-busy", "live"]
    with pytest.raises(NotFound, match="no node 'gone'"):
        client.node("gone")
    client.close()
    assert sorted(h.client.scan_iter(match="fleet:node:gone*")) == sorted(
        h.client.scan_iter(match="fleet:node:gone-*")
    )
    # And every key of its bus queue is gone (not another queue's whose name starts alike), while the
    # other nodes' queues keep their messages
    gone = node_queue("gone")
    left = sorted(k.decode() for k in bus.scan_iter(match="fleet:*"))
    assert [k for k in left if k.endswith(gone) or f"{gone}." in k] == [
        f"fleet:__acks__.0b7c4d3e-dead-agent.{gone}.other"
    ]
    for name in ("gone-busy", "gone-1d", "live"):
        assert bus.hlen(f"fleet:{node_queue(name)}.msgs") == 1


def test_a_functions_call_lives_as_long_as_the_jobs_that_name_it_and_goes_with_the_last(
    harness: Harness, clock: Clock
) -> None:
    h, now = harness, clock.now
    h.node("n")
    blobs = BlobStore(connect_binary(h.settings), K, ttl_s=60)
    # Given two calls uploaded (kept 60 s after their upload), one named by two jobs, the other by a
    # job array of two tasks, and a job naming none
    calls = [blobs.put(digest_of(data), data, "default") and digest_of(data) for data in (b"one", b"two")]
    first = {"call": {"blob": calls[0], "function": "m.f"}}
    for job_id in ("a", "b"):
        submit(h, job_id, now - 1200, **first)
    submit(h, "plain", now - 1200)
    spec = JobSpec.parse(
        {"name": "j", "command": ["true"], "gpus": 1, "call": {"blob": calls[1], "function": "m.g"}}
    )
    assert ArrayStore(h.jobs).create("arr", spec, (0, 1), None, now - 1200)

    def stored(digest: str) -> tuple[bool, int]:
        key = K.blob(digest.removeprefix("sha256:"))
        return bool(blobs.redis.exists(key)), int(blobs.redis.pttl(key))

    # Then each call outlives its upload's 60 s: it has no expiry while they exist
    assert [stored(c) for c in calls] == [(True, -1), (True, -1)]
    # And uploading or naming one again (a HEAD, a submit) gives it no expiry
    assert blobs.put(calls[0], b"one", "other") and blobs.use(calls[0], ["default"])
    assert stored(calls[0]) == (True, -1)
    # When job a ends and is deleted by retention, then its call stays for job b
    run_attempt(h, "a", 0, now - 120)
    assert h.controller.expire() == 1
    assert stored(calls[0]) == (True, -1)
    # When job b and one task of the array go too, then the first call goes with b
    for job_id in ("b", "arr-0", "plain"):
        run_attempt(h, job_id, 0, now - 100)
    assert h.controller.expire() == 3
    assert stored(calls[0]) == (False, -2)
    assert stored(calls[1]) == (True, -1)
    # And the second goes with the array's last task
    run_attempt(h, "arr-1", 0, now - 90)
    assert h.controller.expire() == 1
    assert stored(calls[1]) == (False, -2)
    assert not [
        *blobs.redis.scan_iter(match=b"fleet:blob:*"),
        *blobs.redis.scan_iter(match=b"fleet:blobsize:*"),
    ]
    blobs.redis.close()


def test_retention_store_reports_only_jobs_it_deleted(harness: Harness, clock: Clock) -> None:
    h, now = harness, clock.now
    # Given a job that exists, one that retention deleted, and a name fleet never knew
    submit(h, "alive", now)
    h.client.set(K.tombstone("deleted"), "{}")
    # Then only the deleted one is reported as expired (the agent removes only its directory)
    assert RetentionStore(h.client, K).expired(["alive", "deleted", "unknown"]) == {"deleted"}


def test_an_expired_job_is_gone_for_users_agents_and_memory(
    procs: FleetProcs, client: Client, redis_url: str
) -> None:
    r = redis_py.Redis.from_url(redis_url, decode_responses=True)
    procs.env.update(
        FLEET_JOB_RETENTION_S="1",
        FLEET_TOMBSTONE_RETENTION_S="4",
        FLEET_CONTROLLER__RETENTION_INTERVAL_S="0.5",
        FLEET_AGENT__CHECKPOINT_SWEEP_INTERVAL_S="0.3",
    )
    procs.one_node(client, "t-ret", gpus=2)
    time.sleep(1)  # the empty fleet settles (leader lease, node record)
    baseline = set(r.keys("*"))
    root = procs.root / "checkpoints"
    # Given a job that ran and logged, one still running, and in the checkpoint root a directory
    # fleet knows nothing about and a link, named like a job with a tombstone, to a directory outside
    done = client.submit(JobSpec(name="done", command=["sh", "-c", "echo hello from done"], gpus=1))
    running = client.submit(JobSpec(name="long", command=["sleep", "60"], gpus=1))
    assert done.wait(timeout=30).state == JobState.SUCCEEDED, procs.logs()
    wait_for(lambda: running.status().state == JobState.RUNNING, what="running")
    (root / "someone-elses").mkdir()
    outside = procs.root / "outside"
    outside.mkdir()
    (outside / "model.pt").write_text("precious")
    os.symlink(outside, root / "linked")
    r.set(K.tombstone("linked"), '{"state": "SUCCEEDED", "ended_at": 1, "expired_at": 2}', ex=4)
    # When more than the retention (1 s) passes after the job ended
    wait_for(lambda: not r.exists(K.job(done.id)), timeout=30, what="the finished job deleted")
    # Then its record, history and logs are gone
    assert sorted(r.scan_iter(match=f"fleet:job:{done.id}*")) == [K.tombstone(done.id)]
    # And `fleet show` says it expired, and when, with the not-found exit code
    shown = cli(procs, "show", done.id)
    assert shown.returncode == 3, shown.stderr
    assert f"fleet: job '{done.id}' expired: it ended SUCCEEDED at " in shown.stderr
    # And the running job is untouched
    status = running.status()
    assert (status.state, status.attempt) == (JobState.RUNNING, 1)
    # And the agent removed the expired job's checkpoint directory and kept every other one
    wait_for(lambda: not (root / done.id).exists(), timeout=10, what="checkpoint dir removed")
    assert (root / running.id).is_dir() and (root / "someone-elses").is_dir()
    assert (root / "linked").is_symlink() and (outside / "model.pt").read_text() == "precious"
    # And once the running job ends too and every tombstone expired, Redis holds what the empty
    # fleet held, the submission counter (it keeps FIFO order across the fleet's life), the
    # tenants' job uids (kept for good: a tenant's files keep their owner) and the accounting rows of
    # the two jobs (`fleet history`, kept for accounting_retention_s)
    running.cancel()
    # (but for the webhook sender's outbox, emptied of what it read, its cursor and node states)
    hooks = {K.outbox, K.webhooks("cursor"), K.webhooks("nodes")}

    # (and a live API process's wake stream, its own until it stops: fleet.state.watch)
    def held() -> set[str]:
        return {k for k in r.keys("*") if not k.startswith(K.wake(""))} - hooks

    expected = (baseline - hooks) | {K.seq, K.job_uids, K.acct_days}

    def days() -> set[str]:
        return {K.acct_day(int(day)) for day in r.zrange(K.acct_days, 0, -1)}

    wait_for(lambda: held() == expected | days(), timeout=30, what=f"keys back to the baseline {expected}")
    assert sorted(job for key in days() for job in r.hkeys(key)) == sorted([done.id, running.id])
    assert r.xlen(K.outbox) == 0
    assert cli(procs, "show", done.id).stderr == f"fleet: no job '{done.id}' (list jobs with `fleet jobs`)\n"
    r.close()


def cli(procs: FleetProcs, *args: str) -> subprocess.CompletedProcess[str]:
    env = procs.cli_env()
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def runtime() -> str:
    return "process"


def test_a_redis_at_its_maxmemory_refuses_new_work_but_keeps_leases_and_frees_memory(
    harness: Harness, clock: Clock, redis_url: str, api: Api
) -> None:
    h, now = harness, clock.now
    h.node("n")
    submit(h, "old", now - 600)
    run_attempt(h, "old", 0, now - 120)
    r = redis_py.Redis.from_url(redis_url)
    # Given Redis at its maxmemory (noeviction: it refuses writes rather than drop fleet data)
    r.config_set("maxmemory", 1)
    try:
        # When a user submits a job, the node's agent heartbeats and the leader renews its lease
        # and runs its retention pass
        argv = [sys.executable, "-m", "fleet", "submit", "--", "true"]
        submitted = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=api.env())
        h.node("n")
        renewed = h.controller.lease.renew()
        deleted = h.controller.expire()
    finally:
        r.config_set("maxmemory", 0)
        r.close()
    # Then the submit fails as Redis being unavailable (exit 5), saying what to change
    assert submitted.returncode == 5, submitted.stderr
    assert "fleet: redis is out of memory: it refuses writes at maxmemory" in submitted.stderr
    # And the node stays alive (its jobs are not fenced), the leader leads, and the job that ended
    # past the retention is deleted, freeing memory
    assert [n.alive for n in h.nodes.all()] == [True]
    assert renewed and deleted == 1
    with pytest.raises(JobExpired):
        h.jobs.get("old")
