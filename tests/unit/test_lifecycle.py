"""Retry policy: job faults spend the budget with backoff; infrastructure faults don't, up to a cap."""

from __future__ import annotations

from fleet.lifecycle import RetryPolicy, decide, explain
from fleet.models import Exit, Fault, Job, JobSpec, JobState

POLICY = RetryPolicy(backoff_s=5, backoff_max_s=60, max_infra_requeues=2)


def job(**fields: object) -> Job:
    spec = JobSpec(name="j", command=["x"], max_attempts=3)
    return Job(id="j", spec=spec, state=JobState.RUNNING, attempt=1, **fields)  # type: ignore[arg-type]


def test_exit_zero_succeeds() -> None:
    assert decide(job(), Exit(code=0, reason="exited with code 0"), POLICY).state == JobState.SUCCEEDED


def test_job_fault_retries_with_exponential_backoff_then_fails() -> None:
    first = decide(job(failures=0), Exit(code=1, reason="exited with code 1"), POLICY)
    second = decide(job(failures=1), Exit(code=1, reason="exited with code 1"), POLICY)
    last = decide(job(failures=2), Exit(code=1, reason="exited with code 1"), POLICY)
    assert (first.state, first.delay, first.incr) == (JobState.QUEUED, 5, {"failures": 1})
    assert (second.state, second.delay) == (JobState.QUEUED, 10)
    assert first.reason == "exited with code 1; retry 2 of 3 in 5s"
    assert (last.state, last.reason) == (JobState.FAILED, "exited with code 1; 3 of 3 attempts used")


def test_backoff_is_capped() -> None:
    assert RetryPolicy(backoff_s=5, backoff_max_s=60).backoff(10) == 60


def test_oom_spends_the_budget_like_any_job_fault() -> None:
    d = decide(job(), Exit(code=137, oom=True, reason="OOMKilled (memory limit 64 MiB)"), POLICY)
    assert d.state == JobState.QUEUED and d.incr == {"failures": 1} and d.reason.startswith("OOMKilled")


def test_infrastructure_faults_requeue_without_spending_retries_up_to_a_cap() -> None:
    d = decide(job(failures=2), Exit(fault=Fault.INFRA, reason="node n1 down"), POLICY)
    assert (d.state, d.delay, d.incr) == (JobState.QUEUED, 0, {"infra_requeues": 1})
    capped = decide(job(infra_requeues=2), Exit(fault=Fault.INFRA, reason="node n1 down"), POLICY)
    assert capped.state == JobState.FAILED and "infrastructure requeue cap (2) reached" in capped.reason


def test_repeated_infrastructure_faults_back_off_like_retries_but_fleets_own_stops_do_not() -> None:
    policy = RetryPolicy(backoff_s=5, backoff_max_s=60, max_infra_requeues=10)
    prepare = Exit(fault=Fault.INFRA, kind="prepare", reason="cannot prepare the attempt on n1")
    delays = [decide(job(infra_requeues=n), prepare, policy).delay for n in range(6)]
    assert delays == [0, 5, 10, 20, 40, 60]
    assert decide(job(infra_requeues=3), prepare, policy).reason.endswith(
        "; requeued in 20s (retry budget not spent)"
    )
    for kind in ("drain", "preempted", "resize", "timeout"):
        chosen = Exit(fault=Fault.INFRA, kind=kind, reason="x")  # as stored: the enum's values parse
        assert decide(job(infra_requeues=3), chosen, policy).delay == 0


def test_fatal_faults_and_cancels_end_the_job() -> None:
    fatal = Exit(fault=Fault.FATAL, reason="image 'x' not found")
    assert decide(job(), fatal, POLICY).state == JobState.FAILED
    assert decide(job(), Exit(fault=Fault.CANCEL), POLICY).state == JobState.CANCELLED
    assert decide(job(cancel_requested=True), Exit(code=143), POLICY).state == JobState.CANCELLED


def test_a_program_that_cannot_run_fails_at_once_without_spending_the_retries() -> None:
    missing = decide(job(), Exit(code=127, reason="exited with code 127"), POLICY)
    assert (missing.state, missing.incr) == (JobState.FAILED, {"failures": 1})
    assert missing.reason.startswith("exited with code 127: the program was not found")
    assert decide(job(), Exit(code=126, reason="exited with code 126"), POLICY).state == JobState.FAILED
    # a program that ran and chose its own code is retried as any failure
    assert decide(job(), Exit(code=2, reason="exited with code 2"), POLICY).state == JobState.QUEUED


def test_a_python_script_that_is_not_there_fails_at_once() -> None:
    # Given python's own words for a missing script, as the last line of an attempt that exited 2
    said = "/usr/bin/python3: can't open file '/fleet/workdir/train.py': [Errno 2] No such file or directory"
    exit = explain(Exit(code=2, reason="exited with code 2"), ["starting", said])
    # Then the job fails without another attempt, saying what python said and what to do
    d = decide(job(), exit, POLICY)
    assert d.state == JobState.FAILED and d.reason.endswith("not retryable")
    assert "can't open file '/fleet/workdir/train.py'" in d.reason and "--workdir" in d.reason


def test_exit_2_without_that_line_or_with_another_code_is_an_ordinary_failure() -> None:
    said = "python3: can't open file 'x.py': [Errno 2] No such file or directory"
    for exit, tail in [
        (Exit(code=2, reason="exited with code 2"), ["usage: train.py [-h]", "error: bad flag"]),
        (Exit(code=1, reason="exited with code 1"), [said]),  # the program ran and printed it itself
        (Exit(code=2, fault=Fault.INFRA, reason="node down"), [said]),
    ]:
        assert explain(exit, tail) == exit
