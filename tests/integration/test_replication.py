"""Acknowledged means replicated: what fleet acknowledges is on a replica.

Real redis-servers and sentinels (those of ``fleet up --ha``); replication is cut by stopping the
replicas (SIGSTOP), so the primary takes writes they never see.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import redis

from bench.procs import DirectClient
from fleet import JobSpec
from fleet.config import load_settings
from fleet.errors import NotReplicated, StoreUnavailable
from fleet.models import Role
from fleet.ops.redis_local import LocalRedis
from fleet.state import Stores
from tests.integration.conftest import primary_port
from tests.support import until

pytestmark = pytest.mark.integration

REPLICAS = ("redis-1", "redis-2")


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def acks(ha: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalRedis]:
    """The HA set, with acknowledged writes waiting 200 ms for a replica (services and tests alike)."""
    monkeypatch.setenv("FLEET_REDIS_REPLICAS_ACK_TIMEOUT_MS", "200")
    yield ha
    for name in REPLICAS:  # a stopped process ignores SIGKILL's cleanup until it runs again
        ha.procs[name].send_signal(signal.SIGCONT)


def replication(ha: LocalRedis, sig: signal.Signals) -> None:
    for name in REPLICAS:
        ha.procs[name].send_signal(sig)


def primary(ha: LocalRedis) -> redis.Redis:
    """A client of the primary itself (not through the sentinels)."""
    password = ha.password_file.read_text().strip()
    return redis.Redis(port=primary_port(ha), password=password, decode_responses=True)


def test_a_write_no_replica_took_is_not_acknowledged_and_a_retry_makes_one_job(acks: LocalRedis) -> None:
    # Given a client of the fleet's Redis, and replicas that take nothing (stopped)
    client = DirectClient(settings=load_settings())
    stores = Stores.open(load_settings())
    replication(acks, signal.SIGSTOP)
    try:
        # When a job is submitted with the caller's id, or a token made
        spec = JobSpec(name="once", command=["true"])
        # Then neither is acknowledged: the caller hears "not replicated yet; retry", a 503 of the API
        with pytest.raises(NotReplicated, match=r"not replicated yet: the submit of job once .* retry"):
            client.submit(spec, job_id="once")
        with pytest.raises(NotReplicated, match="not replicated yet: token"):
            stores.tokens.create("someone", "default", Role.USER)
        # And once the replicas take writes again, the same submit retried is acknowledged
        replication(acks, signal.SIGCONT)
        handle = until(lambda: _submitted(client, spec, "once"), "the retried submit acknowledged")
        # And it made one job, not two
        assert handle.id == "once"
        assert [job.id for job in client.jobs() if job.spec.name == "once"] == ["once"]
    finally:
        replication(acks, signal.SIGCONT)
        stores.close()
        client.close()


def _submitted(client: DirectClient, spec: JobSpec, job_id: str) -> object:
    try:
        return client.submit(spec, job_id=job_id)
    except StoreUnavailable:
        return None
