"""How the agent's one exit path settles an attempt's end (fleet.agent.exits.settle), and how the
retry policy then decides the job's fate from it."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from fleet.agent.exits import settle, time_limit
from fleet.lifecycle import RetryPolicy, decide
from fleet.models import Exit, ExitKind, Fault, Job, JobSpec, JobState, MemberPhase
from fleet.state.records import parse_job

NODE = "n1"
POLICY = RetryPolicy(backoff_s=5, backoff_max_s=60, max_infra_requeues=3)
NO_SCRIPT = "python3: can't open file '/work/train.py': [Errno 2] No such file or directory"


def job(timeout: float | None = None, **fields: object) -> Job:
    spec = JobSpec(
        name="j",
        command=["x"],
        max_attempts=3,
        timeout=timeout,
        requeue_on_timeout=bool(fields.pop("requeue_on_timeout", False)),
    )
    return Job(id="j", spec=spec, state=JobState.RUNNING, attempt=1, started_at=1000.0, **fields)  # type: ignore[arg-type]


def unread() -> Sequence[str]:
    raise AssertionError("the attempt's output was read for an exit that cannot need it")


def settled(
    j: Job,
    exit: Exit,
    *,
    fenced: str | None = None,
    timed_out: bool = False,
    now: float = 1010.0,
    tail: Sequence[str] | None = None,
) -> Exit:
    return settle(
        j,
        exit,
        NODE,
        fenced=fenced,
        timed_out=timed_out,
        now=now,
        tail=unread if tail is None else lambda: tail,
    )


def test_an_exit_nothing_else_explains_is_the_programs_own() -> None:
    for code in (0, 1, 137):
        exit = Exit(code=code, reason=f"exited with code {code}")
        assert settled(job(), exit) == exit
    assert decide(job(), settled(job(), Exit(code=0)), POLICY).state == JobState.SUCCEEDED


def test_a_fenced_attempt_is_the_nodes_fault_whatever_its_code() -> None:
    killed = Exit(code=137, oom=True, reason="exited with code 137")
    exit = settled(job(), killed, fenced="lease lost at 12:00")
    assert (exit.fault, exit.kind, exit.code) == (Fault.INFRA, ExitKind.FENCED, 137)
    assert exit.reason == "stopped by node n1's supervisor: lease lost at 12:00"
    decision = decide(job(failures=2), exit, POLICY)  # the last retry left: not spent
    assert decision.state == JobState.QUEUED and decision.incr == {"infra_requeues": 1}


def test_a_program_that_never_ran_fails_at_once_and_only_a_candidate_reads_its_output() -> None:
    exit = settled(job(), Exit(code=2, reason="exited with code 2"), tail=["starting", NO_SCRIPT])
    assert exit.fault == Fault.FATAL and "the script is not in the job's working directory" in exit.reason
    assert decide(job(), exit, POLICY).state == JobState.FAILED
    # exit 2 with other output is an ordinary failure, retried
    plain = settled(job(), Exit(code=2, reason="exited with code 2"), tail=["usage: train.py [-h]"])
    assert plain.fault == Fault.JOB and decide(job(), plain, POLICY).state == JobState.QUEUED
    # a fenced exit 2 is not the program's (the unread tail would raise)
    assert settled(job(), Exit(code=2), fenced="lease lost").kind == ExitKind.FENCED


@pytest.mark.parametrize("requeue", [False, True])
def test_an_attempt_stopped_at_its_time_limit_ends_as_a_timeout(requeue: bool) -> None:
    limited = job(timeout=60.0, requeue_on_timeout=requeue)
    assert time_limit(limited) == 1060.0
    exit = settled(limited, Exit(code=143, reason="exited with code 143 (SIGTERM)"), timed_out=True)
    assert exit.kind == ExitKind.TIMEOUT and exit.reason.startswith("time limit of 60s reached")
    assert exit.fault == (Fault.INFRA if requeue else Fault.FATAL)
    decision = decide(limited, exit, POLICY)
    assert (decision.state, decision.delay) == ((JobState.QUEUED, 0.0) if requeue else (JobState.FAILED, 0.0))


def test_past_its_limit_only_a_failure_is_a_timeout() -> None:
    # an agent restarted meanwhile does not know it stopped the attempt: past the limit is enough
    limited = job(timeout=60.0)
    assert settled(limited, Exit(code=143), now=2000.0).kind == ExitKind.TIMEOUT
    assert settled(limited, Exit(code=0), now=2000.0) == Exit(code=0)  # finished just in time
    assert settled(limited, Exit(code=1), now=1030.0) == Exit(code=1)  # before it


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"preempt": "node n1 drained"}, ExitKind.DRAIN),
        ({"preempt": "preempted", "preempted_for": "urgent"}, ExitKind.PREEMPTED),
        ({"preempt": "resized to 4 GPUs", "resize_gpus": 4}, ExitKind.RESIZE),
    ],
)
def test_an_attempt_asked_to_leave_is_requeued_without_spending_a_retry(
    fields: dict[str, object], kind: ExitKind
) -> None:
    leaving = job(timeout=60.0, failures=2, **fields)
    exit = settled(leaving, Exit(code=143, reason="exited with code 143"), timed_out=True, now=2000.0)
    assert (exit.fault, exit.kind) == (Fault.INFRA, kind)  # not a timeout: it was asked to leave first
    assert exit.reason == f"{fields['preempt']}: exited with code 143"
    decision = decide(leaving, exit, POLICY)
    assert (decision.state, decision.delay) == (JobState.QUEUED, 0.0)
    # one that finished anyway succeeded; one cancelled meanwhile is cancelled
    assert decide(leaving, settled(leaving, Exit(code=0)), POLICY).state == JobState.SUCCEEDED
    cancelled = leaving.model_copy(update={"cancel_requested": True})
    assert settled(cancelled, Exit(code=143)) == Exit(code=143)
    assert decide(cancelled, settled(cancelled, Exit(code=143)), POLICY).state == JobState.CANCELLED


def test_a_launch_the_node_could_not_prepare_stays_the_nodes_fault() -> None:
    why = "cannot prepare the attempt on n1: disk full"
    exit = Exit(reason=why, fault=Fault.INFRA, kind=ExitKind.PREPARE)
    assert settled(job(), exit) == exit
    cancelled = Exit(fault=Fault.CANCEL, reason="cancelled before start")
    assert decide(job(), settled(job(), cancelled), POLICY).state == JobState.CANCELLED


def test_stored_fault_kind_and_phase_strings_read_as_the_enums() -> None:
    # as an older release wrote them: plain strings, in the job hash
    spec = JobSpec(name="j", command=["x"]).model_dump_json()
    members = json.dumps([["n1", ["g0"]], ["n2", ["g1"]]])
    last = json.dumps({"attempt": 2, "code": 1, "reason": "x", "fault": "infra", "kind": "node_down"})
    raw = {
        "id": "j",
        "spec": spec,
        "state": "RUNNING",
        "attempt": "2",
        "members": members,
        "m0": "done",
        "m1": "running",
        "exit": last,
    }
    stored = parse_job(raw)
    assert stored.last_exit == Exit(code=1, reason="x", fault=Fault.INFRA, kind=ExitKind.NODE_DOWN)
    assert stored.member_phases == [MemberPhase.DONE, MemberPhase.RUNNING]
    assert json.loads(stored.last_exit.model_dump_json())["kind"] == "node_down"  # and are written back alike
