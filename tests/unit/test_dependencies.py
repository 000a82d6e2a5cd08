"""The rule of ``after`` (Slurm's afterok, afterany, afternotok) and the API's check of the jobs named."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import pytest

from fleet import JobSpec, SpecError
from fleet.api.admission import with_dependencies
from fleet.models import Dependency, Job, JobArray, JobState
from fleet.scheduler.dependencies import satisfied, verdict
from fleet.state.jobs import JobStore

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


class Stored:
    """What the API's check reads of the jobs and arrays a spec names."""

    def __init__(self, jobs: list[Job], arrays: list[JobArray]) -> None:
        self.jobs, self.array_records = {j.id: j for j in jobs}, {a.id: a for a in arrays}

    def get_many(self, ids: Iterable[str]) -> list[Job]:
        return [self.jobs[i] for i in ids if i in self.jobs]

    def arrays(self, ids: Iterable[str]) -> dict[str, JobArray]:
        return {i: self.array_records[i] for i in ids if i in self.array_records}


def spec(tenant: str, after: list[str]) -> JobSpec:
    return JobSpec.parse({"name": "x", "command": ["true"], "tenant": tenant, "after": after})


def test_an_arrays_id_stands_for_its_tasks_and_another_tenants_job_for_none() -> None:
    store = Stored(
        [Job(id="mine", spec=spec("a", []), state=R), Job(id="theirs", spec=spec("b", []), state=R)],
        [JobArray(id="sweep", spec=spec("a", []), indices="0-2", size=3)],
    )
    checked = with_dependencies(spec("a", ["mine", "sweep:any"]), cast(JobStore, store))
    assert [(d.job, d.when) for d in checked.after] == [
        ("mine", "ok"),
        ("sweep-0", "any"),
        ("sweep-1", "any"),
        ("sweep-2", "any"),
    ]
    for other in ("theirs", "nope"):
        with pytest.raises(SpecError, match=rf"after: no job or array '{other}' in tenant 'a'"):
            with_dependencies(spec("a", [other]), cast(JobStore, store))


def test_waiting_for_more_jobs_than_a_spec_can_list_is_refused() -> None:
    store = Stored([], [JobArray(id="huge", spec=spec("a", []), indices="0-10000", size=10_001)])
    with pytest.raises(SpecError, match="after: 10001 jobs counting each array's tasks, more than 10000"):
        with_dependencies(spec("a", ["huge"]), cast(JobStore, store))


def test_after_given_to_a_call_is_added_to_each_specs_own() -> None:
    # Given a spec that waits for one job, and jobs given as submit's and submit_many's after=
    from fleet.client import calls, checks
    from fleet.client.handles import JobHandle

    body = {"name": "b", "command": ["true"], "after": ["prep-1"]}
    deps = checks.after([JobHandle(cast(Any, None), "train-1"), "eval-1:any"])
    # Then each body waits for its own and those, the caller's dict left as it was
    assert calls.waiting(body, deps)["after"] == ["prep-1", "train-1", "eval-1:any"]
    assert body["after"] == ["prep-1"] and calls.waiting(body, []) is body
    # And one job given alone is a list of one; anything but a job is refused, naming it
    assert checks.after("train-1") == ["train-1"]
    with pytest.raises(SpecError, match=r"after: 3\.5 is not a job: give handles, job ids"):
        checks.after([3.5])


def test_fleet_show_names_what_a_job_waits_for_and_counts_the_rest() -> None:
    from fleet.cli.showing import AFTER_SHOWN, after

    def waiting(deps: list[str], **call: Any) -> Job:
        calls = {"call": {"blob": "sha256:" + "0" * 64, "function": "g", **call}} if call else {}
        return Job(id="w", spec=JobSpec(name="w", command=["x"], after=deps, **calls), state=JobState.QUEUED)

    assert after(waiting([])) == "-"
    # a call's input says its result is taken
    assert (
        after(waiting(["prep-1", "train-2:any"], inputs=["prep-1"]))
        == "prep-1 (ok, result taken), train-2 (any)"
    )
    # an array's 10,000 tasks: the first few, then how many more
    many = after(waiting([f"sweep-{i}:notok" for i in range(10_000)]))
    assert many.startswith("sweep-0 (notok), sweep-1 (notok)") and many.endswith(
        f"and {10_000 - AFTER_SHOWN:,} more"
    )
    assert many.count("(notok)") == AFTER_SHOWN


def test_a_batch_reads_the_jobs_it_waits_for_once() -> None:
    from fleet.api.admission import Named

    # Given a store that counts its reads, and a batch of specs waiting for the same jobs
    store = Stored([Job(id="mine", spec=spec("a", []), state=R)], [])
    reads: list[list[str]] = []
    get_many = store.get_many
    store.get_many = lambda ids: reads.append(sorted(ids)) or get_many(ids)  # type: ignore[method-assign]
    named = Named(cast(JobStore, store))
    # When each is checked with what was read for the batch
    for _ in range(3):
        assert [
            d.job for d in with_dependencies(spec("a", ["mine"]), cast(JobStore, store), named).after
        ] == ["mine"]
    # Then the job was read once, and one refused still names itself
    assert reads == [["mine"]]
    with pytest.raises(SpecError, match="after: no job or array 'nope' in tenant 'a'"):
        with_dependencies(spec("a", ["mine", "nope"]), cast(JobStore, store), named)
    assert reads == [["mine"], ["nope"]]
