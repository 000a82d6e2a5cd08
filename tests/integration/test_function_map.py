"""Many calls at once: ``f.map`` over many inputs and ``fleet.Executor``, whose futures are the
standard library's, on a fleet of one node with the process runtime."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import sys
from types import ModuleType

import pytest

import fleet
from fleet import AsyncClient, Client, JobArray, JobCancelled, JobState
from tests.conftest import Api
from tests.integration.test_functions import calc, ready, runtime  # noqa: F401 (fixtures)
from tests.support import wait_for

pytestmark = pytest.mark.integration
#: inputs of the map test (the issue's 1,000), and calls a task makes: each task is a process started
#: on this fleet's one node (a Python start-up, about 0.3 s of CPU), so the suite maps them 100 to a
#: task, 10 tasks (one array, watched a round)
MANY, CHUNK = 1000, 100


def test_map_returns_every_result_in_order_and_one_failure_in_its_place(
    ready: Client,  # noqa: F811
    calc: ModuleType,  # noqa: F811
) -> None:
    # Given a function that fails for one input of many
    withdraw = calc.withdraw.on(ready).options(gpus=0)
    amounts = [1 + n % 7 for n in range(MANY)]
    amounts[MANY // 2] = 10**6

    # When it is mapped over all of them, 100 calls a task, failures returned in place
    results = list(withdraw.map([100] * MANY, amounts, chunksize=CHUNK, return_exceptions=True))

    # Then every other call's value comes back, in the inputs' order, and the failure in its place
    assert len(results) == MANY
    failed = results.pop(MANY // 2)
    assert isinstance(failed, calc.Overdrawn) and "1000000 is more than 100" in str(failed)
    assert results == [100 - a for n, a in enumerate(amounts) if n != MANY // 2]
    # And the map was one job array of a task per 100 calls, the one holding the failure FAILED
    (array,) = ready.listing()
    assert isinstance(array, JobArray) and array.size == MANY // CHUNK
    assert array.tasks[JobState.SUCCEEDED] == MANY // CHUNK - 1 and array.tasks[JobState.FAILED] == 1
    # And that task's result (as `fleet result` reads it) is the failure, naming its item
    task = ready.jobs(state="FAILED")[0]
    assert task.array_index == MANY // 2 // CHUNK and task.spec.call is not None
    items = f"items[FLEET_ARRAY_INDEX*{CHUNK}:FLEET_ARRAY_INDEX*{CHUNK}+{CHUNK}] of {MANY}"
    assert items in task.spec.call.args
    with pytest.raises(calc.Overdrawn) as raised:
        fleet.FunctionHandle(ready, task.id, task.spec.call.function).result(timeout=60)
    assert (
        f"item {MANY // 2}: call {MANY // 2 % CHUNK + 1} of the {CHUNK} job {task.id} made"
        in raised.value.__notes__
    )


def test_map_raises_a_failure_after_every_earlier_result_and_unordered_yields_all(
    ready: Client,  # noqa: F811
    calc: ModuleType,  # noqa: F811
) -> None:
    # Given a function that fails for its third input
    withdraw = calc.withdraw.on(ready).options(gpus=0)

    # When it is mapped in order without return_exceptions
    seen: list[int] = []
    with pytest.raises(calc.Overdrawn, match="50 is more than 10"):
        for value in withdraw.map([10] * 5, [1, 2, 50, 3, 4], max_running=2):
            seen.append(value)
    # Then the results before it came first
    assert seen == [9, 8]

    # And unordered, every value comes back, as its call ends, an item that is a call's handle taken
    # as its result on the node (such a map is one job per call, each waiting for its own inputs),
    # and every call waiting for the job given as after
    base, gate = withdraw.submit(20, 10), withdraw.submit(5, 1)
    assert sorted(withdraw.map([base] * 3, [1, 2, 3], ordered=False, after=[gate])) == [7, 8, 9]
    mapped = [j for j in ready.jobs() if j.spec.call and j.spec.call.inputs == [base.id]]
    assert len(mapped) == 3 and all({d.job for d in j.spec.after} == {base.id, gate.id} for j in mapped)
    # And a map of plain items is one array, every task of which waits for the job given as after,
    # its results as they end
    assert sorted(withdraw.map([5, 6], [1, 1], ordered=False, after=[gate])) == [4, 5]
    newest = next(a for a in ready.listing() if isinstance(a, JobArray))
    assert newest.size == 2 and [d.job for d in newest.spec.after] == [gate.id]


def test_calls_and_a_map_from_asyncio_leave_the_event_loop_free(
    ready: Client,  # noqa: F811
    api: Api,
    calc: ModuleType,  # noqa: F811
) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.02)

    async def main() -> None:
        ticker = asyncio.create_task(tick())
        async with AsyncClient(ready.url, api.token) as client:
            # Given calls submitted from one event loop: one to fail, one taking another's result
            withdraw = calc.withdraw.on(client).options(gpus=0)
            ok, bad = await asyncio.gather(withdraw.submit(100, 1), withdraw.submit(1, 100))
            chained = await withdraw.submit(ok, 9)
            # When the last one's result is awaited, then it comes, and the loop ran on meanwhile
            before = ticks
            assert await chained.result(timeout=120) == 90 and ticks > before
            # And the failed call's own exception is raised, with the node's traceback
            with pytest.raises(calc.Overdrawn, match="100 is more than 1") as raised:
                await bad.result(timeout=120)
            assert "raised on the fleet" in raised.value.__notes__[0]
            # And a map yields every value in its item's order, the failure in its place
            before = ticks
            got = [v async for v in withdraw.map([10] * 4, [1, 2, 50, 3], return_exceptions=True)]
            assert got[:2] == [9, 8] and got[3] == 7 and isinstance(got[2], calc.Overdrawn)
            assert ticks > before
        ticker.cancel()

    asyncio.run(main())
    # And the map was one array of four tasks, each ended
    (array, *_) = [a for a in ready.listing() if isinstance(a, JobArray)]
    assert array.size == 4 and array.tasks[JobState.SUCCEEDED] == 3 and array.tasks[JobState.FAILED] == 1


def test_as_completed_from_the_standard_library_on_executor_futures(
    ready: Client,  # noqa: F811
    calc: ModuleType,  # noqa: F811
) -> None:
    # Given an executor on the fleet, used as a ProcessPoolExecutor would be
    done_here: list[cf.Future[object]] = []
    with fleet.Executor(gpus=0, client=ready, python=sys.executable, workdir=calc.HERE) as pool:
        # When calls are submitted, one of them failing
        futures = {pool.submit(calc.withdraw, 100, n): n for n in (1, 2, 500, 3)}
        next(iter(futures)).add_done_callback(done_here.append)
        # Then the standard library's as_completed yields every future once its job ended
        ended = {futures[f]: (f.exception() or f.result()) for f in cf.as_completed(futures, timeout=120)}
    assert {n: v for n, v in ended.items() if n != 500} == {1: 99, 2: 98, 3: 97}
    assert isinstance(ended[500], calc.Overdrawn)
    assert len(done_here) == 1 and done_here[0].result() == 99
    # And the standard library's map works as its own does
    with fleet.Executor(gpus=0, client=ready, python=sys.executable, workdir=calc.HERE) as pool:
        assert list(pool.map(calc.withdraw, [10, 20], [1, 2], timeout=120)) == [9, 18]
        # And with a chunksize, a job makes that many calls: every value before a failure comes back
        # in order, then the failure is raised in its place
        amounts = [1] * MANY
        amounts[MANY // 2] = 10**6
        values = pool.map(calc.withdraw, [100] * MANY, amounts, timeout=120, chunksize=MANY // 4)
        assert [next(values) for _ in range(MANY // 2)] == [99] * (MANY // 2)
        with pytest.raises(calc.Overdrawn, match="1000000 is more than 100"):
            next(values)
        chunks = [j for j in ready.jobs() if j.spec.call and j.spec.call.args.startswith("*item for item in")]
        assert sorted(j.spec.call.args.partition("]")[0] for j in chunks if j.spec.call) == [
            f"*item for item in items[{n}:{n + MANY // 4}" for n in (0, 250, 500, 750)
        ]
        # And a lambda travels by value, as it would to a ProcessPoolExecutor with cloudpickle
        assert pool.submit(lambda x: x * 2, 21).result(timeout=120) == 42


def test_shutdown_with_cancel_futures_cancels_the_queued_jobs(
    ready: Client,  # noqa: F811
    calc: ModuleType,  # noqa: F811
) -> None:
    # Given an executor whose calls each take both GPUs of the only node: one runs, the rest queue
    pool = fleet.Executor(gpus=2, client=ready, python=sys.executable, workdir=calc.HERE)
    futures = [pool.submit(calc.nap, 60) for _ in range(3)]
    wait_for(lambda: futures[0].running(), timeout=60, what="the first call to start")

    # When it is shut down, cancelling the futures not started
    pool.shutdown(wait=False, cancel_futures=True)

    # Then those futures are cancelled, and so are their jobs on the fleet
    assert [f.cancelled() for f in futures] == [False, True, True]
    wait_for(lambda: len(ready.jobs(state="CANCELLED")) == 2, timeout=60, what="the queued jobs cancelled")
    assert [j.state for j in ready.jobs(state="RUNNING")] == [JobState.RUNNING]
    # And the running call goes on; cancelled on the fleet, its future says so
    ready.cancel_jobs([j.id for j in ready.jobs(state="RUNNING")])
    with pytest.raises(JobCancelled):
        futures[0].result(timeout=60)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(calc.nap, 1)


def test_closing_a_map_early_cancels_the_calls_still_queued(
    ready: Client,  # noqa: F811
    calc: ModuleType,  # noqa: F811
) -> None:
    # Given a map whose calls queue behind one another (each takes the node's two GPUs)
    naps = calc.nap.on(ready).options(gpus=2).map([0, 60, 60, 60])

    # When the caller takes the first result and stops
    assert next(naps) == "rested"
    naps.close()

    # Then nothing of it is left queued
    wait_for(lambda: not ready.jobs(state="QUEUED"), timeout=60, what="the queued calls cancelled")
    assert len(ready.jobs(state="SUCCEEDED")) == 1


def test_a_future_cancelled_while_its_job_is_queued_cancels_the_job(
    ready: Client,  # noqa: F811
    calc: ModuleType,  # noqa: F811
) -> None:
    # Given two calls that cannot run at once, the first running
    with fleet.Executor(gpus=2, client=ready, python=sys.executable, workdir=calc.HERE) as pool:
        first, second = pool.submit(calc.nap, 60), pool.submit(calc.nap, 0)
        wait_for(lambda: first.running(), timeout=60, what="the first call to start")
        # When the second's future is cancelled while its job waits
        assert second.cancel()
        # Then its job is cancelled on the fleet, and the first goes on
        wait_for(lambda: ready.jobs(state="CANCELLED"), timeout=60, what="the second's job cancelled")
        assert not first.done()
        ready.cancel_jobs([j.id for j in ready.jobs(state="RUNNING")])
    assert isinstance(first.exception(), JobCancelled) and second.cancelled()


def test_a_bad_executor_field_is_refused_naming_it(ready: Client) -> None:  # noqa: F811
    with pytest.raises(fleet.SpecError, match="max_running 0"):
        fleet.Executor(client=ready, max_running=0)
    with pytest.raises(fleet.SpecError, match="gpus"):
        fleet.Executor(gpus=-1, client=ready)
    with pytest.raises(fleet.SpecError, match="command"):
        fleet.Executor(client=ready, command=["x"])
