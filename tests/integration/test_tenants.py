"""Tenants in Redis: policies operators set, the usage the leader folds, the status readers see."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import redis

from fleet.errors import NotFound, NotLeader
from fleet.keys import Keys
from fleet.models import Tenant, TenantStatus
from fleet.state.tenants import TenantStore

pytestmark = pytest.mark.integration
LEADER = "ctl-test:1"
HOUR = 3600.0


@pytest.fixture
def store(redis: redis.Redis) -> Iterator[TenantStore]:
    redis.set(Keys().leader, LEADER)
    yield TenantStore(redis, Keys())


def test_a_policy_is_stored_replaced_and_deleted(store: TenantStore) -> None:
    # Given a tenant with a guarantee, and one never configured
    store.set(Tenant(name="vision", guaranteed_gpus=4, max_gpus=16, weight=3))
    store.set(Tenant(name="vision", guaranteed_gpus=8, max_gpus=16, weight=3))
    # Then the last write wins, and the unconfigured one gets the default policy
    assert store.get("vision").guaranteed_gpus == 8
    assert [t.name for t in store.all()] == ["vision"]
    assert store.policy("nlp") == Tenant(name="nlp")
    with pytest.raises(NotFound, match="no tenant 'nlp'"):
        store.get("nlp")
    # When deleted, its jobs fall back to the default policy
    assert store.delete("vision") and not store.delete("vision")
    assert store.policy("vision") == Tenant(name="vision") and store.all() == []


def test_an_unreadable_policy_is_skipped_not_fatal(store: TenantStore, redis: redis.Redis) -> None:
    store.set(Tenant(name="ok"))
    redis.hset(Keys().tenants, "broken", "{not json")
    assert [t.name for t in store.all()] == ["ok"]
    assert store.policy("broken") == Tenant(name="broken")


def test_usage_accrues_decays_by_its_half_life_and_is_forgotten(store: TenantStore) -> None:
    # Given tenant a holding 2 GPUs for an hour, with a half-life of one hour
    store.fold({"a": 2}, now=1000.0, half_life=HOUR, leader=LEADER)
    usage = store.fold({"a": 2}, now=1000.0 + HOUR, half_life=HOUR, leader=LEADER)
    # Then it used a little under 7,200 GPU-seconds (the first seconds already weigh less)
    expected = 2 * HOUR / math.log(2) * 0.5
    assert usage.gpu_seconds["a"] == pytest.approx(expected) and 5000 < expected < 7200
    # When it holds nothing for another hour, half of that is left; after weeks, nothing is kept
    assert store.fold({}, now=1000.0 + 2 * HOUR, half_life=HOUR, leader=LEADER).gpu_seconds["a"] == (
        pytest.approx(expected / 2)
    )
    assert store.fold({}, now=1000.0 + 40 * HOUR, half_life=HOUR, leader=LEADER).gpu_seconds == {}


def test_a_deposed_leader_cannot_fold(store: TenantStore, redis: redis.Redis) -> None:
    redis.set(Keys().leader, "ctl-other:2")
    with pytest.raises(NotLeader):
        store.fold({"a": 1}, now=1.0, half_life=HOUR, leader=LEADER)
    assert store.usage().gpu_seconds == {}


def test_status_lists_configured_tenants_and_tenants_with_jobs(store: TenantStore) -> None:
    # Given a configured tenant without jobs, and the leader's published status of an unconfigured one
    store.set(Tenant(name="vision", guaranteed_gpus=4))
    running = TenantStatus(
        tenant=Tenant(name="nlp"), gpus_used=3, jobs_running=2, jobs_pending=5, fair_share_gpus=6.0
    )
    store.fold({"nlp": 3}, now=100.0, half_life=HOUR, leader=LEADER, status=[running])
    store.fold({"nlp": 3}, now=160.0, half_life=HOUR, leader=LEADER, status=[running])
    # Then both are listed, each with its policy and how it stands
    nlp, vision = store.status()
    assert (nlp.tenant.name, nlp.configured, nlp.gpus_used) == ("nlp", False, 3)
    assert nlp.jobs_pending == 0  # counted from the queue as it is now: nothing queued here
    assert nlp.usage_gpu_s == pytest.approx(180, rel=0.01) and nlp.as_of == 160.0
    assert (vision.tenant.guaranteed_gpus, vision.configured, vision.gpus_used) == (4, True, 0)
    # And a policy set after the last fold shows at once
    store.set(Tenant(name="nlp", weight=2))
    assert store.status()[0].tenant.weight == 2 and store.status()[0].configured
