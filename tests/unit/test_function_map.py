"""What ``f.map`` yields from its calls' futures, without a fleet: the order, a failure in its place
or raised after every earlier result, and the calls not yet started cancelled when it stops."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import pytest

import fleet
from fleet.client.executor import results


def ended(*outcomes: Any) -> list[cf.Future[Any]]:
    """Futures resolved to ``outcomes`` (an exception: raised)."""
    futures: list[cf.Future[Any]] = []
    for outcome in outcomes:
        future: cf.Future[Any] = cf.Future()
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        futures.append(future)
    return futures


def test_results_come_in_the_inputs_order_with_a_failure_in_its_place() -> None:
    # Given calls of which the second failed
    futures = ended(1, KeyError("two"), 3)
    # When their results are read with return_exceptions
    got = list(results(None, futures, ordered=True, return_exceptions=True))
    # Then each is in its input's place, the failure too
    assert got[0] == 1 and isinstance(got[1], KeyError) and got[2] == 3


def test_a_failure_is_raised_after_every_earlier_result_and_the_rest_is_cancelled() -> None:
    # Given calls of which the second failed, and a third not started
    futures = [*ended(1, KeyError("two")), cf.Future()]
    seen: list[Any] = []
    # When their results are read without return_exceptions
    with pytest.raises(KeyError, match="two"):
        for value in results(None, futures, ordered=True, return_exceptions=False):
            seen.append(value)
    # Then the earlier result came first, and the call not started is cancelled
    assert seen == [1] and futures[2].cancelled()


def test_unordered_results_come_as_the_calls_end() -> None:
    # Given a call still running and one that ended
    running: cf.Future[Any] = cf.Future()
    running.set_running_or_notify_cancel()
    futures = [running, *ended("second")]
    # When results are read as they end
    got = results(None, futures, ordered=False, return_exceptions=False)
    # Then the ended one comes first
    assert next(got) == "second"
    running.set_result("first")
    assert list(got) == ["first"]


def test_closing_the_results_early_cancels_the_calls_not_started() -> None:
    futures = [*ended(1), cf.Future(), cf.Future()]
    got = results(None, futures, ordered=True, return_exceptions=False)
    assert next(got) == 1
    got.close()
    assert [f.cancelled() for f in futures] == [False, True, True]


def test_an_executor_is_the_standard_librarys() -> None:
    # Code written for concurrent.futures takes it as it takes a ProcessPoolExecutor
    assert issubclass(fleet.Executor, cf.Executor)
    with pytest.raises(fleet.SpecError, match="max_running 0: expected a whole number"):
        fleet.Executor(max_running=0)
