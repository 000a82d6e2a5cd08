"""The failover test's checker (tests/chaos/checker.py): a history that holds passes, and each way a
failover could break a promise is named."""

from __future__ import annotations

from tests.chaos.checker import History, Run, check


def run(
    job: str,
    attempt: int,
    start: float,
    end: float,
    *,
    gpu: str = "g0",
    node: str = "n1",
    finished: bool = True,
) -> Run:
    return Run(job, attempt, node, (gpu,), start, end, finished)


def good() -> History:
    """Two jobs on one GPU one after the other, one of them requeued once (its first run killed),
    and a cancelled one that never ran."""
    return History(
        submitted={"a", "b", "c"},
        cancelled={"c"},
        final={"a": "SUCCEEDED", "b": "SUCCEEDED", "c": "CANCELLED"},
        runs=[run("a", 1, 0, 1, finished=False), run("a", 2, 2, 3), run("b", 1, 4, 5)],
    )


def test_a_history_that_keeps_every_promise_passes() -> None:
    assert check(good()) == []


def test_a_lost_or_unfinished_acknowledged_submit_is_named() -> None:
    history = good()
    del history.final["b"]
    history.submitted.add("d")
    history.final["d"] = "RUNNING"
    assert check(history) == [
        "job b: submit acknowledged, job lost",
        "job d: submit acknowledged, still RUNNING at the end",
    ]


def test_an_acknowledged_cancel_that_did_not_take_effect_is_named() -> None:
    history = good()
    history.final["c"] = "SUCCEEDED"
    history.runs.append(run("c", 1, 6, 7))
    assert check(history) == ["job c: cancel acknowledged, ended SUCCEEDED"]


def test_a_job_that_did_its_work_twice_or_succeeded_without_doing_it_is_named() -> None:
    history = good()
    history.runs.append(run("b", 2, 6, 7))  # run again after a failover lost its end
    history.runs = [r for r in history.runs if r.job_id != "a" or not r.finished]
    assert check(history) == [
        "job b: finished its work 2 times",
        "job a: SUCCEEDED without a run that finished",
    ]


def test_runs_of_one_job_or_on_one_gpu_that_overlap_are_named() -> None:
    history = good()
    # b's first run goes on (a node the fleet lost) while its second runs elsewhere, on the GPU that
    # a's run holds until after the second one started
    history.runs = [
        run("b", 1, 0, 10, gpu="g1", finished=False),
        run("a", 2, 1, 3.5, gpu="g0"),
        run("b", 2, 3, 4, gpu="g0", node="n2"),
    ]
    assert check(history) == [
        "job b: b attempt 1 on n1 and b attempt 2 on n2 overlapped (3.000 <= 10.000)",
        "GPU g0: a attempt 2 on n1 and b attempt 2 on n2 overlapped (3.000 <= 3.500)",
    ]


def test_a_claim_left_at_the_end_is_named() -> None:
    history = good()
    history.claims = {"g0": "a:2"}
    assert check(history) == ["GPU g0 still claimed by a:2"]
