"""Malformed messages are dead-lettered and logged; the agent keeps serving."""

from __future__ import annotations

import dramatiq
import pytest
import redis

from fleet import Client, JobSpec, JobState
from fleet.bus import Bus, node_queue
from tests.conftest import FleetProcs

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def dead_letters(settings_url: str, queue: str) -> list[str]:
    with redis.Redis.from_url(settings_url.rsplit("/", 1)[0] + "/1", decode_responses=True) as bus_db:
        return list(bus_db.zrange(f"fleet:{queue}.XQ", 0, -1))


def test_malformed_messages_are_dead_lettered_and_the_agent_keeps_serving(
    procs: FleetProcs, client: Client
) -> None:
    # Given a running node
    procs.controller()
    procs.agent("t-bus", gpus=1)
    procs.wait_nodes(client, 1)
    bus = Bus(procs.settings())
    queue = node_queue("t-bus")
    # When messages arrive with a bad payload, with positional args, and for an unknown actor
    bad = [
        dramatiq.Message(queue_name=queue, actor_name="launch", args=(), kwargs={"job_id": 7}, options={}),
        dramatiq.Message(queue_name=queue, actor_name="launch", args=("x", 1), kwargs={}, options={}),
        dramatiq.Message(queue_name=queue, actor_name="no_such_actor", args=(), kwargs={}, options={}),
    ]
    sent = [bus.broker.enqueue(m).options["redis_message_id"] for m in bad]
    # Then the agent still runs jobs
    job = client.submit(JobSpec(name="after", command=["true"]))
    assert job.wait(timeout=30).state == JobState.SUCCEEDED
    # And every bad message sits in the node queue's dead-letter set, logged with what was wrong
    assert sorted(dead_letters(procs.redis_url, queue)) == sorted(sent)
    agent_log = (procs.root / "t-bus.log").read_text()
    assert agent_log.count("message_dead_lettered") == 3
    assert "malformed Launch" in agent_log and "attempt" in agent_log
    assert procs.procs["t-bus"].poll() is None
    bus.close()
