"""The rule of ``after``: Slurm's afterok, afterany and afternotok over the dependencies' states."""

from __future__ import annotations

import pytest

from fleet import JobSpec, SpecError
from fleet.models import Dependency, JobState
from fleet.scheduler.dependencies import satisfied, verdict

S, F, C, R = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RUNNING


@pytest.mark.parametrize(
    ("when", "state", "expected"),
    [
        ("ok", S, True),
        ("ok", F, False),
        ("ok", C, False),
        ("any", F, True),
        ("any", S, True),
        ("notok", F, True),
        ("notok", C, True),
        ("notok", S, False),
        ("ok", R, None),
        ("any", JobState.QUEUED, None),
        ("any", None, True),  # gone: retention removes only ended jobs
        ("ok", None, False),
    ],
)
def test_each_kind_of_dependency_against_each_state(
    when: str, state: JobState | None, expected: bool
) -> None:
    assert satisfied(when, state) is expected


def test_a_job_waits_naming_the_first_open_dependency() -> None:
    after = [Dependency(job="a"), Dependency(job="b", when="any")]
    assert verdict(after, {"a": S, "b": R}).waiting == "waiting for job b to end"
    assert verdict(after, {"a": S, "b": F}) == verdict([], {})


def test_one_dependency_that_can_never_be_satisfied_decides() -> None:
    after = [Dependency(job="a"), Dependency(job="b")]
    found = verdict(after, {"a": R, "b": F})
    assert found.never == "dependency b ended FAILED (after ok)" and not found.waiting


def test_the_spec_takes_ids_with_their_kind_and_refuses_a_bad_kind() -> None:
    after = ["a", "b:notok", {"job": "c", "when": "any"}]
    spec = JobSpec.parse({"name": "x", "command": ["true"], "after": after})
    assert [(d.job, d.when) for d in spec.after] == [("a", "ok"), ("b", "notok"), ("c", "any")]
    with pytest.raises(SpecError, match=r"after\.0\.when: Input should be 'ok', 'any' or 'notok'"):
        JobSpec.parse({"name": "x", "command": ["true"], "after": ["a:maybe"]})
