"""The agent's reconcile is a pure function: property-tested over random node states."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.agent.reconcile import reconcile, still_lost
from fleet.agent.runtime.base import AttemptStatus
from fleet.models import Exit, Job, JobSpec, JobState, Member, MemberPhase

NODE = "n1"
SPEC = JobSpec(name="j", command=["true"])
ids = st.sampled_from(["a", "b", "c", "d"])
attempts = st.integers(min_value=1, max_value=3)


@st.composite
def held(draw: st.DrawFn) -> AttemptStatus:
    running = draw(st.booleans())
    exit = None if running else draw(st.one_of(st.none(), st.just(Exit(code=0))))
    return AttemptStatus(draw(ids), draw(attempts), running, exit)


@st.composite
def job(draw: st.DrawFn) -> Job:
    return Job(
        id=draw(ids),
        spec=SPEC,
        state=draw(st.sampled_from(list(JobState))),
        attempt=draw(attempts),
        node=draw(st.sampled_from([NODE, "n2", None])),
        cancel_requested=draw(st.booleans()),
    )


def keys(statuses: list[AttemptStatus]) -> list[tuple[str, int]]:
    return [(s.job_id, s.attempt) for s in statuses]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(held(), unique_by=lambda s: (s.job_id, s.attempt), max_size=6),
    st.lists(job(), unique_by=lambda j: j.id, max_size=4),
    st.sets(st.tuples(ids, attempts), max_size=3),
    st.sets(st.tuples(ids, attempts), max_size=3),
)
def test_every_attempt_lands_in_at_most_one_bucket_and_the_current_one_is_never_killed(
    runtime: list[AttemptStatus],
    stored: list[Job],
    busy: set[tuple[str, int]],
    shipping: set[tuple[str, int]],
) -> None:
    jobs = {j.id: j for j in stored}
    on_node = [j for j in stored if j.node == NODE and j.state.on_node]
    out = reconcile(NODE, runtime, jobs, on_node, busy, shipping)
    acted = keys(out.finish) + keys(out.stale) + keys(out.stop) + keys(out.reattach)
    # each held attempt in at most one bucket, none of them busy (being launched or finished)
    assert len(acted) == len(set(acted)) and not set(acted) & busy
    for status in out.stale:  # killed only when it is not the job's current attempt here
        j = jobs.get(status.job_id)
        assert status.running
        assert j is None or j.attempt != status.attempt or j.node != NODE or not j.state.on_node
    for status in out.stop + out.reattach:  # only the current attempt is stopped or followed
        j = jobs[status.job_id]
        assert status.running and j.attempt == status.attempt and j.node == NODE
    held_keys = set(keys(runtime))
    for j in out.launch + out.lost:  # launched or declared lost only when the runtime holds nothing
        assert (j.id, j.attempt) not in held_keys and (j.id, j.attempt) not in busy
    assert all(j.state == JobState.SCHEDULED for j in out.launch)
    assert all(j.state in (JobState.STARTING, JobState.RUNNING) for j in out.lost)


def test_a_finished_attempt_is_finished_and_a_lost_one_reported() -> None:
    current = Job(id="a", spec=SPEC, state=JobState.RUNNING, attempt=2, node=NODE)
    vanished = Job(id="b", spec=SPEC, state=JobState.RUNNING, attempt=1, node=NODE)
    out = reconcile(
        NODE,
        [AttemptStatus("a", 2, False, Exit(code=0))],
        {"a": current, "b": vanished},
        [current, vanished],
        set(),
        set(),
    )
    assert keys(out.finish) == [("a", 2)] and [j.id for j in out.lost] == ["b"]


def test_an_attempt_that_ended_after_the_reconcile_looked_is_not_lost() -> None:
    # Given a two-node job's attempt 1 as a reconcile read it: running, both members running
    members = [Member(node=NODE, gpus=["g0"]), Member(node="n2", gpus=["g1"])]
    running = [MemberPhase.RUNNING, MemberPhase.RUNNING]
    seen = Job(
        id="g",
        spec=SPEC,
        state=JobState.RUNNING,
        attempt=1,
        node=NODE,
        members=members,
        member_phases=running,
    )
    # Then it is still lost only if the record, read again once its end is claimed, still says so
    assert still_lost(NODE, seen, seen)
    # not once this node's member is done (exited 0 while the other runs on)
    done = [MemberPhase.DONE, MemberPhase.RUNNING]
    assert not still_lost(NODE, seen, seen.model_copy(update={"member_phases": done}))
    # nor once the attempt ended, or another began
    assert not still_lost(NODE, seen, seen.model_copy(update={"state": JobState.SUCCEEDED}))
    assert not still_lost(NODE, seen, seen.model_copy(update={"attempt": 2, "state": JobState.QUEUED}))


def test_a_running_elastic_attempt_is_told_the_batch_its_record_says() -> None:
    elastic = JobSpec.parse(
        {
            "name": "e",
            "command": ["t"],
            "gpus": {"min": 1, "max": 2},
            "batch_size": {"min": 64, "max": 512},
            "profile": "learn",
        }
    )
    running = Job(id="e", spec=elastic, state=JobState.RUNNING, attempt=1, node=NODE, batch_size=256)
    starting = running.model_copy(update={"id": "s", "state": JobState.STARTING})
    plain = Job(id="p", spec=SPEC, state=JobState.RUNNING, attempt=1, node=NODE)
    leaving = running.model_copy(update={"id": "l", "preempt": "resize"})
    held = [AttemptStatus(j.id, 1, True) for j in (running, starting, plain, leaving)]
    jobs = {j.id: j for j in (running, starting, plain, leaving)}
    out = reconcile(NODE, held, jobs, list(jobs.values()), set(), set())
    # only the running elastic attempt that stays: one leaving is stopped, not told
    assert [(s.job_id, batch) for s, batch in out.rebatch] == [("e", 256)]
    assert keys(out.stop) == [("l", 1)]
