"""Each tenant's job uid: given once, fleet-wide, from agent.job_uid_range (real Redis)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

from fleet.agent.launcher import job_user
from fleet.config_sections import AgentSettings
from fleet.errors import LaunchError, SpecError
from fleet.keys import Keys
from fleet.state.uids import JobUids

RANGE = (5000, 3)


def test_each_tenant_gets_the_next_uid_and_keeps_it(redis: redis.Redis) -> None:
    uids = JobUids(redis, Keys())
    assert [uids.uid(t, RANGE) for t in ("alice", "bob", "alice", "carol", "bob")] == [
        5000,
        5001,
        5000,
        5002,
        5001,
    ]


def test_a_tenant_has_the_same_uid_on_every_node(redis: redis.Redis) -> None:
    # Given two agents (each its own store, as on two nodes): a tenant's uid is the same on both
    first, second = JobUids(redis, Keys()), JobUids(redis, Keys())
    assert first.uid("bob", RANGE) == 5000
    assert (second.uid("alice", RANGE), second.uid("bob", RANGE)) == (5001, 5000)
    assert redis.hgetall("fleet:job_uids") == {"bob": "0", "alice": "1"}


def test_a_tenant_past_the_ranges_size_gets_none_and_nothing_is_recorded(redis: redis.Redis) -> None:
    uids = JobUids(redis, Keys())
    for tenant in ("a", "b", "c"):
        uids.uid(tenant, RANGE)
    with pytest.raises(LaunchError) as err:
        uids.uid("d", RANGE)
    assert not err.value.retryable
    assert "tenant 'd' has no job uid: agent.job_uid_range (5000-5002) holds 3 uids" in str(err.value)
    assert redis.hlen("fleet:job_uids") == 3
    # and a range widened at its end gives it the next uid
    assert uids.uid("d", (5000, 10)) == 5003


def test_uids_given_at_once_by_many_agents_are_all_different(redis: redis.Redis) -> None:
    stores = [JobUids(redis, Keys()) for _ in range(8)]
    found: dict[str, int] = {}
    lock = threading.Lock()

    def take(store: JobUids, index: int) -> None:
        for n in range(25):
            tenant = f"t{(n * 8 + index) % 100}"
            uid = store.uid(tenant, (1, 1000))
            with lock:
                assert found.setdefault(tenant, uid) == uid

    threads = [threading.Thread(target=take, args=(s, i)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 100 and sorted(found.values()) == list(range(1, 101))


def _never() -> int:
    raise AssertionError("no tenant uid should be needed")


@pytest.fixture
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet.agent.launcher.os.geteuid", lambda: 0)


@pytest.mark.parametrize(
    ("requested", "agent", "tenant_uid", "expected"),
    [
        (None, {}, lambda: 1_000_000_007, (1_000_000_007, 1_000_000_007)),  # the tenant's own
        ((102, 105), {}, _never, (102, 105)),  # allow-listed for its tenant (checked before)
        (None, {"job_user": "1000:1001"}, _never, (1000, 1001)),  # one person's machine
        ((102, 105), {"job_user": "1000:1001"}, _never, (102, 105)),
        ((0, 100), {"allow_root_jobs": True}, _never, (0, 100)),
    ],
)
def test_a_root_agent_runs_a_job_as(
    as_root: None,
    requested: tuple[int, int] | None,
    agent: dict[str, object],
    tenant_uid: Callable[[], int],
    expected: tuple[int, int],
) -> None:
    assert job_user(requested, AgentSettings(**agent), tenant_uid) == expected


def test_uid_0_needs_allow_root_jobs(as_root: None) -> None:
    with pytest.raises(SpecError, match=r"user: jobs may not run as root .* allow_root_jobs"):
        job_user((0, 100), AgentSettings(), _never)


def test_an_agent_that_is_not_root_runs_jobs_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet.agent.launcher.os.geteuid", lambda: 1234)
    assert job_user(None, AgentSettings(), _never) is None
    assert job_user((1234, 99), AgentSettings(), _never) is None
    with pytest.raises(SpecError, match="agent is not root and runs jobs as uid 1234 only"):
        job_user((102, 105), AgentSettings(), _never)
