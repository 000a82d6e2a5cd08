"""Retention, pure: which ended jobs and which gone nodes are due; what a deleted job's reader is told."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet.controller.retention import due_jobs, gone_nodes
from fleet.errors import JobExpired, NotFound
from fleet.models import Node, NodeState

NOW = 1_800_000_000.0
DAY = 86400.0


def test_jobs_that_ended_at_least_the_retention_ago_are_due_and_no_others() -> None:
    # Given jobs that ended 8 days, exactly 7 days, and 7 days less a second ago
    ended = [("old", NOW - 8 * DAY), ("exact", NOW - 7 * DAY), ("recent", NOW - 7 * DAY + 1)]
    # When retention is 7 days
    due = due_jobs(ended, NOW, 7 * DAY)
    # Then the two that ended at least 7 days ago are due, and the recent one is kept
    assert due == ("old", "exact")


# whole seconds: unix times as floats are exact there, so the property compares no rounding errors
@given(st.lists(st.tuples(st.text(min_size=1), st.integers(0, int(NOW))), max_size=30),
       st.integers(1, 30 * 86400))  # fmt: skip
def test_a_job_is_due_exactly_when_its_end_is_retention_or_more_ago(
    ended: list[tuple[str, float]], retention: int
) -> None:
    due = due_jobs(ended, NOW, retention)
    assert list(due) == [job_id for job_id, at in ended if NOW - at >= retention]


def node(name: str, alive: bool, heartbeat_at: float, **kw: object) -> Node:
    state = NodeState.READY if alive else NodeState.DOWN
    return Node(name=name, state=state, alive=alive, heartbeat_at=heartbeat_at, **kw)  # type: ignore[arg-type]


def test_only_nodes_gone_for_the_retention_and_holding_nothing_are_removed() -> None:
    # Given nodes: long gone and empty; long gone but still bound to a job or holding a claim;
    # gone for a day; alive with an old heartbeat record (its lease says it lives)
    nodes = [
        node("gone", alive=False, heartbeat_at=NOW - 8 * DAY),
        node("gone-with-job", alive=False, heartbeat_at=NOW - 8 * DAY, jobs=["j1"]),
        node("gone-with-claim", alive=False, heartbeat_at=NOW - 8 * DAY, claims={"g0": "j2:1"}),
        node("just-gone", alive=False, heartbeat_at=NOW - DAY),
        node("alive", alive=True, heartbeat_at=NOW - 8 * DAY),
    ]
    # When node retention is 7 days
    # Then only the empty node gone for 8 days is removed
    assert gone_nodes(nodes, NOW, 7 * DAY) == ("gone",)


def test_a_reader_of_a_deleted_job_is_told_it_expired_and_when_and_it_is_still_not_found() -> None:
    error = JobExpired("train-1", "SUCCEEDED", ended_at=NOW - 7 * DAY, expired_at=NOW)
    assert str(error) == (
        "job 'train-1' expired: it ended SUCCEEDED at 2027-01-08 08:00:00 UTC and its record, history and "
        "logs were deleted at 2027-01-15 08:00:00 UTC (job_retention_s)"
    )
    assert isinstance(error, NotFound) and error.exit_code == 3
