"""Redis Sentinel: the fleet follows a failover of its Redis primary with no service restarted.

Real redis-servers and sentinels (those of ``fleet up --ha``), a real controller and agent.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.procs import DirectClient, FleetProcs
from fleet import JobSpec, JobState
from fleet.api.queries import Queries
from fleet.bus import Bus, JobSubmitted
from fleet.config import load_settings
from fleet.errors import StoreUnavailable
from fleet.keys import Keys
from fleet.models import Role
from fleet.ops import redis_local
from fleet.ops.local import free_port
from fleet.ops.redis_local import LocalRedis
from fleet.state import Stores
from fleet.state.connection import connect
from tests.chaos.failover import Cluster
from tests.integration.conftest import primary_port
from tests.integration.test_metrics import scrape
from tests.support import until, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def hello(**fields: object) -> JobSpec:
    return JobSpec.parse({"name": "hello", "command": [sys.executable, "-c", "print('hello')"], **fields})


def replicated(ha: LocalRedis) -> int:
    """How many replicas hold every write the primary took so far (``WAIT``, after a write of ours)."""
    client = connect(load_settings())
    pipe = client.pipeline(transaction=False)  # one connection: WAIT counts that connection's writes
    pipe.set("test:replicated", 1).wait(redis_local.REPLICAS, 5000)
    _, count = pipe.execute()
    client.close()
    return int(count)


def test_jobs_run_on_after_the_primary_is_killed_and_none_replicated_is_lost(
    ha: LocalRedis, tmp_path: Path
) -> None:
    # Given a controller and an agent that know Redis only through the sentinels
    procs = FleetProcs(ha.url, tmp_path, "process")
    client = DirectClient(settings=load_settings())
    metrics = procs.env["FLEET_CONTROLLER__METRICS_PORT"] = str(free_port())
    try:
        procs.one_node(client, "t-a", gpus=2)
        # And a job that ran, every write of it on both replicas
        before = client.submit(hello())
        assert before.wait(timeout=30).state == JobState.SUCCEEDED
        assert replicated(ha) == redis_local.REPLICAS
        # (the controller's metrics say so: both replicas in sync, each with its lag, all sentinels agree)
        seen = scrape(int(metrics))
        assert seen["fleet_redis_replicas_connected"] == 2 and seen["fleet_redis_sentinels_agreeing"] == 3
        assert len([k for k in seen if k.startswith("fleet_redis_replica_lag_bytes{")]) == 2
        assert seen["fleet_redis_failovers_total"] == 0
        # When the primary is SIGKILLed, and the first sentinel the services ask with it (one
        # machine), and the two sentinels left promote a replica
        old = primary_port(ha)
        for name in ("redis-0", "sentinel-0"):
            ha.procs[name].send_signal(signal.SIGKILL)
        until(lambda: primary_port(ha) != old, "a replica promoted", timeout=30)
        # Then a job submitted now runs to the end, on the services that were already running
        after = until(lambda: _submitted(client), "a submit on the new primary", timeout=30)
        assert after.wait(timeout=30).state == JobState.SUCCEEDED, procs.logs()
        assert [name for name, proc in procs.procs.items() if proc.poll() is not None] == []
        # And the job from before the failover is still there, as it ended
        assert before.status().state == JobState.SUCCEEDED
        assert before.logs() == "hello"
        # And each service logged the failover once, naming the new primary
        for service in ("controller", "t-a"):
            lines = [
                x for x in (tmp_path / f"{service}.log").read_text().splitlines() if "redis_failover" in x
            ]
            assert len(lines) == 1 and f"primary=127.0.0.1:{primary_port(ha)} " in lines[0], lines
            assert f"previous=127.0.0.1:{old} cut_off_s=" in lines[0]
            # cut off at least until the sentinels gave up on the old primary (down after 1 s)
            assert float(lines[0].rpartition("cut_off_s=")[2]) >= 1.0, lines
        # And the controller counted it, and reads the new primary's one replica (within its few seconds)
        until(lambda: _redis_metrics(int(metrics)) == (1, 1, 2), "the failover in the metrics", timeout=30)
        # And the fleet shows it once, though two processes (the controller, this test's client) saw it
        stores = Stores.open(load_settings())
        status = Queries(stores).redis_status()
        stores.close()
        assert (status.primary, status.failovers) == (f"127.0.0.1:{primary_port(ha)}", 1), status
        assert status.last_failover is not None and status.last_failover.previous == f"127.0.0.1:{old}"
    finally:
        procs.stop()
        client.close()


def _redis_metrics(port: int) -> tuple[float, float, float]:
    """The controller's failovers seen, replicas in sync and sentinels agreeing."""
    seen = scrape(port)
    names = (
        "fleet_redis_failovers_total",
        "fleet_redis_replicas_connected",
        "fleet_redis_sentinels_agreeing",
    )
    return tuple(seen.get(name, -1) for name in names)  # type: ignore[return-value]


def _submitted(client: DirectClient) -> object:
    try:
        return client.submit(hello())
    except StoreUnavailable:
        return None


def test_a_running_bus_consumer_gets_messages_sent_after_the_failover(ha: LocalRedis) -> None:
    # Given a bus consumer that took a message from the first primary
    bus = Bus(load_settings())
    seen: queue.Queue[str] = queue.Queue()
    bus.handle("test.sentinel", JobSubmitted, lambda msg: seen.put(msg.job_id))
    worker = bus.worker("test.sentinel", threads=1)
    try:
        bus.send("test.sentinel", JobSubmitted(job_id="before"))
        assert seen.get(timeout=10) == "before"
        # When the primary is SIGKILLed and a replica promoted
        old = primary_port(ha)
        ha.procs["redis-0"].send_signal(signal.SIGKILL)
        until(lambda: primary_port(ha) != old, "a replica promoted", timeout=30)
        # Then a message sent now reaches the same consumer, through the new primary
        until(lambda: _sent(bus, "after"), "a send on the new primary", timeout=30)
        assert seen.get(timeout=30) == "after"
    finally:
        worker.stop()
        bus.close()


def _sent(bus: Bus, job_id: str) -> bool:
    try:
        bus.send("test.sentinel", JobSubmitted(job_id=job_id))
    except redis.ConnectionError:
        return False
    return True


def test_a_demoted_primary_is_an_outage_to_retry_not_a_crash(ha: LocalRedis) -> None:
    # Given a store connected to the primary through the sentinels
    stores = Stores.open(load_settings())
    try:
        assert stores.redis.set("test:before", 1)
        # When the primary is made a replica with the store's connection still open (as a primary
        # cut off from the sentinels finds itself demoted when the network heals)
        password = ha.password_file.read_text().strip()
        with redis.Redis(port=primary_port(ha), password=password) as primary:
            replica = primary.info("replication")["slave0"]["port"]
            primary.replicaof("127.0.0.1", replica)
            # Then a write through the store is refused as "Redis unavailable" (retryable), not as an error
            with pytest.raises(StoreUnavailable, match="previous master is now a slave"):
                stores.tokens.create("someone", "default", Role.USER)
            # And once the sentinels' primary takes writes again, the same store writes there
            primary.replicaof("no", "one")
        wait_for(lambda: stores.redis.set("test:after", 1), timeout=30, what="a write to the primary")
    finally:
        stores.close()


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("FLEET_REDIS_MASTER", "mymaster", "watches no 'mymaster'"),
        ("FLEET_REDIS_SENTINEL_PASSWORD_FILE", "wrong", "AuthenticationError"),
    ],
)
def test_a_wrong_master_name_or_sentinel_password_is_named(
    ha: LocalRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, value: str, said: str
) -> None:
    # Given a service whose master name, or sentinels' password, is not the sentinels'
    if setting.endswith("_FILE"):
        (tmp_path / value).write_text("not-the-password\n")
        value = str(tmp_path / value)
    monkeypatch.setenv(setting, value)
    stores = Stores.open(load_settings())
    try:
        # When it calls Redis, Then the error says what each sentinel answered and what to check
        with pytest.raises(StoreUnavailable) as raised:
            stores.tokens.create("someone", "default", Role.USER)
        message = str(raised.value)
        assert message.count(said) == 3 and "check redis_master, redis_sentinels" in message, message
        assert "not-the-password" not in message and "<redis.client" not in message
    finally:
        stores.close()


def test_fleet_direct_finds_the_primary_through_the_sentinels(ha: LocalRedis) -> None:
    # Given the sentinels and the password files in the environment (as `fleet up --ha` gives), and a
    # redis_url whose host is no Redis: with sentinels only its DB number counts
    env = {k: v for k, v in os.environ.items() if k.startswith("FLEET_REDIS") or k in ("PATH", "HOME")}
    env["FLEET_REDIS_URL"] = "redis://127.0.0.1:1/0"
    assert "FLEET_REDIS_SENTINELS" in env
    # When an operator makes the first admin token with --direct
    argv = [sys.executable, "-m", "fleet", "token", "create", "--user", "root", "--tenant", "default"]
    done = subprocess.run([*argv, "--role", "admin", "--direct"], env=env, capture_output=True, text=True)
    # Then it is written to the primary, and the token works there
    assert done.returncode == 0, done.stderr
    token = re.search(r"fleet_\S+", done.stdout)
    assert token is not None, done.stdout
    stores = Stores.open(load_settings())
    try:
        assert stores.tokens.identify(token[0]) is not None
    finally:
        stores.close()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """Redis with two replicas and three sentinels, each Redis behind a forwarder the test cuts; the
    settings of this process name it, and acknowledged writes wait 200 ms for a replica."""
    cluster = Cluster(tmp_path / "redis")
    for name, value in cluster.ha.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLEET_REDIS_REPLICAS_ACK_TIMEOUT_MS", "200")
    yield cluster
    cluster.close()


def test_writes_leave_a_primary_cut_off_and_back_before_the_sentinels_demote_it(cluster: Cluster) -> None:
    # Given a store with a connection open to the primary, each Redis behind a forwarder the test cuts
    stores = Stores.open(load_settings())
    try:
        stores.tokens.create("before", "default", Role.USER)
        # When a partition cuts the primary off, the sentinels promote a replica, and the partition
        # heals before they demote the old primary (they look at it again within 10 s): the store's
        # connection reaches it again, and it still takes writes as a primary with no replica
        fault = cluster.partition(hold_s=0)
        # Then the first write there is not acknowledged, and a retry is, by the promoted replica,
        # while the old primary is still a primary: the store left it as soon as a write fell short
        with pytest.raises(StoreUnavailable):
            stores.tokens.create("during", "default", Role.USER)
        token, _ = stores.tokens.create("after", "default", Role.USER)
        assert cluster.role(fault.victim) == "master"
        assert cluster.primary() != fault.victim and stores.tokens.identify(token) is not None
    finally:
        stores.close()


def test_a_leader_leaves_a_primary_cut_off_and_back_before_the_sentinels_demote_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given a controller leading (a 5 s lease), on a primary behind a forwarder the test cuts
    procs = FleetProcs(cluster.ha.url, tmp_path, "process")
    procs.env.update(FLEET_CONTROLLER__LEADER_LEASE_S="5")
    keys = Keys(load_settings().key_prefix)
    try:
        procs.controller()
        wait_for(lambda: "leadership_acquired" in procs.logs(), 30, "a leader", procs)
        # When the primary is cut off, a replica promoted (with the lease, counting down), and the
        # cut healed before the sentinels demote the old primary, which the renewals reach again
        fault = cluster.partition(hold_s=0)
        with cluster.client(cluster.primary()) as new:
            left = new.pttl(keys.leader)
            # Then the controller renews its lease on the promoted replica, while the old primary is
            # still a primary: a renewal that no replica took sent it there
            assert left > 0
            wait_for(lambda: new.pttl(keys.leader) > left + 1000, 30, "the lease renewed there", procs)
        assert cluster.role(fault.victim) == "master"
    finally:
        procs.stop()
