"""What ``fleet nodes``, the status page and the metrics say of the fleet's Redis, from ``INFO``."""

from __future__ import annotations

import pytest

from fleet.config import load_settings
from fleet.models import Failover, RedisStatus
from fleet.state import sentinel
from fleet.state.redisinfo import replicas_of
from fleet.text import redis_line

#: a primary's ``INFO replication`` as redis-py parses it: one replica in sync, one taking its first copy
INFO = {
    "role": "master",
    "connected_slaves": 2,
    "slave0": {"ip": "10.0.0.2", "port": 6379, "state": "online", "offset": 1000, "lag": 0},
    "slave1": {"ip": "fd00::3", "port": 6379, "state": "wait_bgsave", "offset": 0, "lag": 3},
    "master_repl_offset": 1500,
}


def test_each_replicas_lag_is_what_the_primary_wrote_that_it_has_not_acknowledged() -> None:
    found = replicas_of(INFO)
    assert [(r.address, r.state, r.lag_bytes, r.lag_s) for r in found] == [
        ("10.0.0.2:6379", "online", 500, 0),
        ("[fd00::3]:6379", "wait_bgsave", 1500, 3),
    ]
    assert replicas_of({"role": "master", "connected_slaves": 0, "master_repl_offset": 9}) == []


def test_the_redis_line_says_primary_replicas_sentinels_and_the_last_failover() -> None:
    # A fleet with one Redis
    alone = RedisStatus(primary="127.0.0.1:6379")
    assert redis_line(alone, 0) == "redis: primary 127.0.0.1:6379, no replicas"
    # One under Sentinel, through a failover 5 minutes ago
    last = Failover(at=1000.0, primary="10.0.0.2:6379", previous="10.0.0.1:6379", cut_off_s=4.2, epoch=3)
    ha = RedisStatus(
        primary="10.0.0.2:6379",
        replicas=replicas_of(INFO),
        sentinels=3,
        sentinels_agreeing=2,
        failovers=2,
        last_failover=last,
    )
    assert redis_line(ha, 1300.0) == (
        "redis: primary 10.0.0.2:6379, 2 replicas (lag at most 1.5 KiB, 3 s; 1 not yet in sync), "
        "2 of 3 sentinels agree; 2 failovers, the last 5m ago: 10.0.0.1:6379 -> 10.0.0.2:6379, "
        "services cut off 4.2 s"
    )
    # And one it could not read says why
    refused = RedisStatus(error="this service's Redis user may not run INFO: add +info ...")
    assert (
        redis_line(refused, 0) == "redis: unknown (this service's Redis user may not run INFO: add +info ...)"
    )


def test_a_failover_counts_for_the_fleet_whose_sentinels_it_was_seen_through_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A process (a notebook, a script) that talked to two fleets, each under its own sentinels
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "10.9.0.1:26379,10.9.0.2:26379")
    one = load_settings()
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "10.9.1.1:26379,10.9.1.2:26379")
    other = load_settings()
    # When its connections to the first reach a new primary (nothing is dialled: the sentinels'
    # manager is told where a connection landed, as a connection tells it)
    manager = sentinel.manager(one)
    assert isinstance(manager, sentinel._Manager)
    manager.reached(("10.9.0.5", 6379), 0.0)
    manager.reached(("10.9.0.6", 6379), 0.0)
    # Then the failover is the first fleet's, and the other fleet's Redis never records it
    seen = sentinel.failovers_seen(one)
    assert [(f.previous, f.primary) for f in seen] == [("10.9.0.5:6379", "10.9.0.6:6379")]
    assert sentinel.failovers_seen(other) == []
