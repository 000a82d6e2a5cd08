"""Bad messages are dead-lettered and logged once; idle workers block on their own queue's wake list
instead of polling it, stop at once, and leave nothing behind."""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from fleet import Client, JobSpec, JobState
from fleet.bus import CONTROLLER_QUEUE, Bus, JobSubmitted, NodeChanged, node_queue
from fleet.bus.wake import wake_list
from fleet.config import load_settings
from tests.conftest import FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def bus_db(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1", decode_responses=True)


def dead_letters(redis_url: str, queue: str) -> list[str]:
    with bus_db(redis_url) as db:
        return list(db.zrange(f"fleet:{queue}.XQ", 0, -1))


def test_malformed_messages_are_dead_lettered_and_the_agent_keeps_serving(
    procs: FleetProcs, client: Client
) -> None:
    # Given a running node
    procs.one_node(client, "t-bus", gpus=1)
    bus = Bus(procs.settings())
    queue = node_queue("t-bus")
    # When messages arrive with a bad payload, with positional args, for an unknown actor,
    # and as bytes that are not a dramatiq message at all
    bad = [
        dramatiq.Message(queue_name=queue, actor_name="launch", args=(), kwargs={"job_id": 7}, options={}),
        dramatiq.Message(queue_name=queue, actor_name="launch", args=("x", 1), kwargs={}, options={}),
        dramatiq.Message(queue_name=queue, actor_name="no_such_actor", args=(), kwargs={}, options={}),
    ]
    sent = [bus.broker.enqueue(m).options["redis_message_id"] for m in bad]
    bus.broker.do_enqueue(queue, "not-a-message", b"{not json")
    sent.append("not-a-message")
    # Then the agent still runs jobs
    job = client.submit(JobSpec(name="after", command=["true"]))
    assert job.wait(timeout=30).state == JobState.SUCCEEDED
    # And every bad message sits in the node queue's dead-letter set, logged once with what was
    # wrong, and none is left for dramatiq to deliver again
    assert sorted(dead_letters(procs.redis_url, queue)) == sorted(sent)
    assert redelivery_pending(procs.redis_url, queue) == []
    agent_log = (procs.root / "t-bus.log").read_text()
    assert agent_log.count("message_dead_lettered") == 4
    assert "malformed Launch" in agent_log and "attempt" in agent_log
    assert "not a dramatiq message" in agent_log
    assert procs.procs["t-bus"].poll() is None
    bus.close()


QUEUE = "fleet.test"


class Recorder:
    """A bus with one handler on QUEUE that records the job id of every message it handles."""

    def __init__(self, redis_url: str, poll_ms: int | None = None) -> None:
        self.bus = Bus(load_settings(redis_url=redis_url, bus_poll_ms=poll_ms))
        self.seen: list[str] = []
        self.bus.handle(QUEUE, JobSubmitted, lambda msg: self.seen.append(msg.job_id))

    def send(self, *job_ids: str) -> None:
        for job_id in job_ids:
            self.bus.send(QUEUE, JobSubmitted(job_id=job_id))

    def wait_seen(self, count: int, timeout: float = 8.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return sorted(self.seen)


def redelivery_pending(redis_url: str, queue: str) -> list[str]:
    """Ids still on the queue or fetched and not yet acked: what dramatiq would deliver again."""
    with bus_db(redis_url) as db:
        acks = [k for k in db.scan_iter("fleet:__acks__.*") if k.endswith("." + queue)]
        return sorted([*db.lrange(f"fleet:{queue}", 0, -1), *(m for k in acks for m in db.smembers(k))])


def dead_lettered_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "message_dead_lettered" in r.getMessage()]


def test_bytes_that_are_not_a_message_do_not_hold_up_the_messages_fetched_with_them(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given bytes that are not a dramatiq message queued ahead of three messages
    rec = Recorder(redis_url)
    rec.bus.broker.do_enqueue(QUEUE, "garbage-1", b"\x00not a dramatiq message")
    rec.send("j0", "j1", "j2")
    # When a worker consumes the queue (fetching them together: prefetch is twice the threads)
    worker = rec.bus.worker(QUEUE, threads=2)
    try:
        seen = rec.wait_seen(3)
    finally:
        worker.stop(timeout=2000)
        rec.bus.close()
    # Then every message is handled exactly once
    assert seen == ["j0", "j1", "j2"]
    # And the bytes sit in the dead-letter set, logged once, and nothing is left to redeliver
    assert dead_letters(redis_url, QUEUE) == ["garbage-1"]
    assert redelivery_pending(redis_url, QUEUE) == []
    [line] = dead_lettered_logs(caplog)
    assert "garbage-1" in line and "not a dramatiq message" in line


def test_a_queue_keeps_only_the_newest_dead_letters(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # Given a bus that keeps at most 2 dead letters per queue
    bus = Bus(load_settings(redis_url=redis_url, bus_poll_ms=10, bus_dead_letters_max=2))
    bus.handle(QUEUE, JobSubmitted, lambda msg: None)
    # When 4 malformed messages (positional arguments), then bytes that are no message, arrive
    sent = []
    for _ in range(4):
        message = dramatiq.Message(
            queue_name=QUEUE, actor_name="job_submitted", args=(1,), kwargs={}, options={}
        )
        sent.append(bus.broker.enqueue(message).options["redis_message_id"])
    worker = bus.worker(QUEUE, threads=1)
    try:
        wait_for(lambda: len(dead_lettered_logs(caplog)) == 4)
        bus.broker.do_enqueue(QUEUE, "garbage-1", b"\x00not a dramatiq message")
        wait_for(lambda: len(dead_lettered_logs(caplog)) == 5)
    finally:
        worker.stop(timeout=2000)
        bus.close()
    # Then each was logged, and only the newest 2 are kept, ids and data alike
    kept = dead_letters(redis_url, QUEUE)
    assert len(kept) == 2 and kept[-1] == "garbage-1" and kept[0] in sent
    with bus_db(redis_url) as db:
        assert sorted(db.hkeys(f"fleet:{QUEUE}.XQ.msgs")) == sorted(kept)


def test_leadership_changes_leave_the_process_as_one_does(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a bus whose handlers are declared once, as the controller does at start
    rec = Recorder(redis_url)
    threads = threading.active_count()

    def lead(job_id: str) -> None:
        worker = rec.bus.worker(QUEUE, threads=1)  # what Leadership.renew does on leadership_acquired
        rec.send(job_id)
        rec.wait_seen(len(rec.seen) + 1)
        worker.stop(timeout=2000)  # what Leadership.follow does on leadership_lost

    lead("j0")
    middleware = list(rec.bus.broker.middleware)
    # When it gains and loses leadership three more times
    for job_id in ("j1", "j2", "j3"):
        lead(job_id)
    # Then the broker's middleware is as after one leadership, and no thread is left behind
    assert rec.bus.broker.middleware == middleware
    assert threading.active_count() == threads
    # And every message was handled exactly once, with no warning logged on the way
    assert rec.seen == ["j0", "j1", "j2", "j3"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # And a handler declared afterwards wakes no stopped worker up to consume its queue
    rec.bus.handle("fleet.later", NodeChanged, lambda msg: None)
    time.sleep(0.1)
    assert threading.active_count() == threads
    rec.bus.close()


def test_a_worker_polls_only_its_own_queue(redis_url: str) -> None:
    # Given a bus with a handler on a queue, looking at it every 100 ms even when not woken
    rec = Recorder(redis_url, poll_ms=100)
    # When a worker starts on it
    worker = rec.bus.worker(QUEUE, threads=1)
    try:
        commands = monitor(redis_url, seconds=0.5)
        consumers = set(worker.consumers)
    finally:
        worker.stop(timeout=2000)
        rec.bus.close()
    # Then it runs one consumer, for the queue itself, and no Redis command touches its delay queue
    assert consumers == {QUEUE}
    assert any(QUEUE in c for c in commands)
    assert [c for c in commands if f"{QUEUE}.DQ" in c] == []
    # And a delayed message (which nothing would consume) is refused
    with pytest.raises(ValueError, match="delay"):
        rec.bus.broker.enqueue(
            dramatiq.Message(queue_name=QUEUE, actor_name="job_submitted", args=(), kwargs={}, options={}),
            delay=1000,
        )


def monitor(redis_url: str, seconds: float) -> list[str]:
    """Every command Redis receives during ``seconds`` (MONITOR), as text."""
    seen: list[str] = []
    with redis.Redis.from_url(redis_url, socket_timeout=5) as r, r.monitor() as m:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            seen.append(m.next_command()["command"])
    return seen


def blocked_consumers(redis_url: str) -> int:
    """Bus clients blocked in BLPOP right now: idle consumers waiting for a wake-up."""
    with bus_db(redis_url) as db:
        return sum(1 for c in db.client_list() if c["cmd"] == "blpop" and "b" in c["flags"])


def wait_blocked(redis_url: str, count: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while blocked_consumers(redis_url) < count:
        assert time.monotonic() < deadline, f"{count} consumers never blocked"
        time.sleep(0.02)


def test_a_message_sent_to_an_idle_consumer_is_handled(redis_url: str) -> None:
    # Given an idle worker, blocked on its wake list
    rec = Recorder(redis_url, poll_ms=500)
    worker = rec.bus.worker(QUEUE, threads=1)
    try:
        wait_blocked(redis_url, 1)
        # When a message is sent
        rec.send("j0")
        # Then it is handled
        assert rec.wait_seen(1) == ["j0"]
        # And when a message's wake-up is lost (enqueued by dramatiq alone, as by a sender that
        # died between the two), the consumer's safety-net fetch still finds it
        wait_blocked(redis_url, 1)
        lost = dramatiq.Message(
            queue_name=QUEUE, actor_name="job_submitted", args=(), kwargs={"job_id": "j1"}, options={}
        )
        RedisBroker.enqueue(rec.bus.broker, lost)
        with bus_db(redis_url) as db:
            assert db.llen(wake_list("fleet", QUEUE)) == 0
        assert rec.wait_seen(2) == ["j0", "j1"]
    finally:
        worker.stop(timeout=2000)
        rec.bus.close()
    assert redelivery_pending(redis_url, QUEUE) == []


def test_a_message_a_dead_process_fetched_and_never_acked_is_delivered_again(redis_url: str) -> None:
    # Given a message fetched by a process that then died: still in its unacked set, its last
    # dramatiq heartbeat older than dramatiq's heartbeat timeout
    # dramatiq heartbeat older than dramatiq's heartbeat timeout; it had fetched from another queue too
    dead = Bus(load_settings(redis_url=redis_url)).broker
    for queue, job in ((QUEUE, "j0"), ("other", "o0")):
        dead.enqueue(
            dramatiq.Message(
                queue_name=queue, actor_name="job_submitted", args=(), kwargs={"job_id": job}, options={}
            )
        )
        assert len(dead.do_fetch(queue, 1)) == 1
    with bus_db(redis_url) as db:
        db.zadd("fleet:__heartbeats__", {dead.broker_id: 0})
        assert redelivery_pending(redis_url, QUEUE) != []
    # When a worker starts on the queue (and blocks there, instead of polling)
    rec = Recorder(redis_url)
    worker = rec.bus.worker(QUEUE, threads=1)
    try:
        # Then dramatiq's maintenance moves the message back and it is handled, once
        seen = rec.wait_seen(1)
    finally:
        worker.stop(timeout=2000)
        rec.bus.close()
    assert seen == ["j0"]
    assert redelivery_pending(redis_url, QUEUE) == []
    # And the dead process stays known while it holds messages of the other queue (maintenance
    # looks for its fetched sets by SCAN, not KEYS, which the services' Redis users may not run)
    with bus_db(redis_url) as db:
        assert db.zscore("fleet:__heartbeats__", dead.broker_id) == 0
        # until maintenance on that queue gives its message back too: then it is forgotten
        probe = Bus(load_settings(redis_url=redis_url)).broker
        probe.do_fetch("other", 0)
        assert redelivery_pending(redis_url, "other") != [] and db.llen("fleet:other") == 1
        assert db.zscore("fleet:__heartbeats__", dead.broker_id) is None
    probe.close()
    dead.close()


def test_a_duplicated_wake_up_handles_the_message_once(redis_url: str) -> None:
    # Given an idle worker that is never woken by its safety net during the test
    rec = Recorder(redis_url, poll_ms=10_000)
    worker = rec.bus.worker(QUEUE, threads=2)
    try:
        wait_blocked(redis_url, 1)
        # When a message is sent and its wake-up token is pushed twice more
        with bus_db(redis_url) as db:
            db.lpush(wake_list("fleet", QUEUE), "dup", "dup")
        rec.send("j0")
        # Then it is handled, and a message sent after it too, each once
        rec.wait_seen(1)
        wait_blocked(redis_url, 1)
        rec.send("j1")
        seen = rec.wait_seen(2)
    finally:
        worker.stop(timeout=2000)
        rec.bus.close()
    assert seen == ["j0", "j1"] and len(rec.seen) == 2
    assert redelivery_pending(redis_url, QUEUE) == []


def test_a_stopped_worker_stops_without_waiting_out_its_block(redis_url: str) -> None:
    # Given an idle worker blocked for up to 10 s, longer than its stop may take
    rec = Recorder(redis_url, poll_ms=10_000)
    threads = threading.active_count()
    worker = rec.bus.worker(QUEUE, threads=2)
    wait_blocked(redis_url, 1)
    # When it is stopped, allowing 2 s for its worker threads and 2 s for its consumer
    worker.stop(timeout=2000)
    # Then every thread it started has ended, and nothing blocks on Redis any more
    assert threading.active_count() == threads
    assert blocked_consumers(redis_url) == 0
    rec.bus.close()


def test_idle_services_fetch_only_at_their_safety_net_rate(procs: FleetProcs, client: Client) -> None:
    # Given a controller and an agent with nothing to do, both consumers blocked on their wake lists
    procs.one_node(client, "t-idle", gpus=1)
    wait_blocked(procs.redis_url, 2)
    poll_s = procs.settings().bus_poll_ms / 1000
    # When they are watched for a few safety-net periods
    with redis.Redis.from_url(procs.redis_url) as db:
        before, started = db.info("commandstats"), time.monotonic()
        commands = monitor(procs.redis_url, seconds=2 * poll_s + 0.5)
        after, seconds = db.info("commandstats"), time.monotonic() - started
    # Then each consumer fetched (one LPOP inside dramatiq's fetch script, on an empty queue) about
    # once per bus_poll_ms, not every few ms as dramatiq's polling consumer does, and each wait
    # in between was one BLPOP
    fetches = calls(after, "lpop") - calls(before, "lpop")
    assert 0 < fetches <= 2 * (seconds / poll_s + 2)
    assert calls(after, "blpop") - calls(before, "blpop") <= fetches + 2
    # And the two consumers were the controller's and the node's, each on its own queue's wake list
    waited = {w.removeprefix("fleet:__wake__.") for c in commands if c.startswith("BLPOP") for w in c.split()}
    assert {CONTROLLER_QUEUE, node_queue("t-idle")} <= waited


def calls(stats: dict[str, dict[str, int]], command: str) -> int:
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
