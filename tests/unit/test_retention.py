"""Retention, pure: which ended jobs and which gone nodes are due; what a deleted job's reader is told;
which checkpoint directories the agent's sweep may consider, and that it never follows a link."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fleet.agent.sweep import job_dirs, remove
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
@given(
    st.lists(st.tuples(st.text(min_size=1), st.integers(0, int(NOW))), max_size=30),
    st.integers(1, 30 * 86400),
)
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


def test_the_sweep_considers_only_real_directories_named_like_jobs(tmp_path: Path) -> None:
    # Given a checkpoint root with a job's directory, a file, a name no job can have, and a link
    # named like a job pointing at a directory outside the root
    (tmp_path / "job-a").mkdir()
    (tmp_path / "job-b.txt").write_text("not a directory")
    (tmp_path / ".hidden").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep.pt").write_text("precious")
    os.symlink(outside, tmp_path / "job-link")
    # When the sweep lists candidates and is asked to remove the link and the real directory
    listed = job_dirs(tmp_path)
    removed_link = remove(tmp_path, "job-link")
    removed_dir = remove(tmp_path, "job-a")
    # Then only the real directory was a candidate and went; the link and what it points at stay
    assert listed == ["job-a"]
    assert (removed_link, removed_dir) == (False, True)
    assert not (tmp_path / "job-a").exists()
    assert (tmp_path / "job-link").is_symlink() and (outside / "keep.pt").read_text() == "precious"
    # And a directory already removed (by another node's agent on shared storage) is no error
    assert remove(tmp_path, "job-a") is False
    assert job_dirs(tmp_path / "missing-root") == []


def test_the_sweep_removes_a_directory_without_following_links_inside_it(tmp_path: Path) -> None:
    # Given an expired job's directory holding a link (the job wrote it) to a file outside
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    root = tmp_path / "root"
    (root / "job-a").mkdir(parents=True)
    os.symlink(outside, root / "job-a" / "latest")
    os.symlink(tmp_path, root / "job-a" / "up")
    # When it is removed
    assert remove(root, "job-a")
    # Then the directory is gone and what its links pointed at is untouched
    assert not (root / "job-a").exists()
    assert outside.read_text() == "precious"
