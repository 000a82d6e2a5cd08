"""Functions from asyncio without a fleet (``f.on(async_client)``): what ``await submit``, ``await
result()`` and ``async for ... in map`` give, in which order, what they cancel, and that none of them
holds the event loop; the calls are made here, by a stand-in for the client and its node."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import importlib
import pickle
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cloudpickle
import pytest

import fleet
from fleet.aio import AsyncClient, AsyncFunction, AsyncFunctionHandle
from fleet.client.aio import WAIT_ROUND_S
from fleet.client.aio_functions import call_results
from fleet.client.mapped import Tasks
from fleet.client.pickled import pickle_call
from fleet.errors import JobTimeout, SpecError
from fleet.models import Job, JobSpec, JobState
from fleet.models.arrays import task_id
from fleet_worker import call as runner
from fleet_worker import formats


class Overdrawn(ValueError):
    pass


@fleet.function(gpus=0)
def withdraw(balance: int, amount: int) -> int:
    if amount > balance:
        raise Overdrawn(f"{amount} is more than {balance}")
    return balance - amount


class Node:
    """Stands in for a :class:`fleet.Client` and its fleet: a job makes its call here when it is
    first waited for (each task of a map only once ``release`` says so, if it is given)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.jobs_: dict[str, Job] = {}
        self.calls: dict[str, tuple[Any, tuple[Any, ...]]] = {}
        self.outcomes: dict[str, bytes] = {}
        self.cancelled: list[str] = []
        self.release: threading.Event | None = None
        self.transport = SimpleNamespace(close=lambda: None, close_all=lambda: None)

    def upload_blob(self, data: bytes) -> str:
        digest = f"sha256:{len(self.blobs):064d}"
        self.blobs[digest] = data
        return digest

    def _queue(self, job_id: str, index: int | None = None) -> None:
        job_spec = JobSpec(name="c", command=["c"])
        self.jobs_[job_id] = Job(id=job_id, spec=job_spec, state=JobState.QUEUED, array_index=index)

    def submit(self, spec: dict[str, Any], after: Any = None) -> SimpleNamespace:
        job_id = f"call-{len(self.jobs_)}"
        _, payload = runner.unpack(runner.CALL_MAGIC, self.blobs[spec["call"]["blob"]])
        _, args, _ = cloudpickle.loads(payload)
        self.calls[job_id] = (spec["call"]["function"], args)
        self._queue(job_id)
        return SimpleNamespace(id=job_id)

    def submit_array(self, spec: dict[str, Any], indices: range, max_running: int | None) -> SimpleNamespace:
        data = self.blobs[spec["call"]["blob"]]
        for index in indices:
            _, _, (call,), _ = formats.task_calls(data, index)
            self.calls[task_id("map", index)] = (spec["call"]["function"], cloudpickle.loads(call)[0])
            self._queue(task_id("map", index), index)
        return SimpleNamespace(id="map")

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        job = self.jobs_[job_id]
        if job.state.final:
            return job
        if self.release is not None and not self.release.wait(timeout or 10):
            raise JobTimeout(f"job {job_id} still QUEUED")
        module, _, name = self.calls[job_id][0].rpartition(".")
        try:
            value = getattr(importlib.import_module(module), name).fn(*self.calls[job_id][1])
            self.outcomes[job_id], state = runner._outcome(runner.RETURNED, value), JobState.SUCCEEDED
        except Exception as exc:
            self.outcomes[job_id], state = runner._outcome(runner.RAISED, None, exc), JobState.FAILED
        update = {"state": state, "attempt": 1, "outputs_attempt": 1}
        self.jobs_[job_id] = job.model_copy(update=update)
        return self.jobs_[job_id]

    def array(self, array_id: str) -> SimpleNamespace:
        return SimpleNamespace(tasks=Counter(j.state for j in self.jobs_.values()))

    def jobs(self, labels: dict[str, str], limit: int) -> list[Job]:
        return list(reversed(self.jobs_.values()))[:limit]

    def cancel_jobs(self, ids: list[str], state: str | None = None) -> None:
        self.cancelled += ids

    def download(self, job_id: str, path: str, dest: str) -> list[Path]:
        file = Path(dest) / runner.OUTCOME
        file.write_bytes(self.outcomes[job_id])
        return [file]


def on_node() -> tuple[AsyncClient, Node]:
    client, node = AsyncClient("http://127.0.0.1:9", "token", max_threads=4), Node()
    client.sync = node  # type: ignore[assignment]
    return client, node


def test_a_call_submitted_from_asyncio_returns_its_value_or_raises_its_exception() -> None:
    async def main() -> None:
        client, _ = on_node()
        async with client:
            # Given a function for asyncio
            account = withdraw.on(client)
            assert isinstance(account, AsyncFunction) and account.name.endswith(".withdraw")
            # When two calls are submitted, the second failing
            ok, bad = await account.submit(100, 1), await account.submit(1, 100)
            # Then each handle gives its call's value, or raises its exception with the node's traceback
            assert isinstance(ok, AsyncFunctionHandle) and ok.job_id == ok.id == "call-0"
            assert await ok.result(timeout=10) == 99
            with pytest.raises(Overdrawn, match="100 is more than 1") as raised:
                await bad.result()
            assert "raised on the fleet" in (raised.value.__notes__ or [""])[0]

    asyncio.run(main())


def test_an_async_handle_is_an_argument_as_a_sync_one_is() -> None:
    # Given an async call's handle among another call's arguments
    client, _ = on_node()
    handle = AsyncFunctionHandle(client, fleet.FunctionHandle(client.sync, "f-1", "calc.f"))  # type: ignore[arg-type]
    passed: list[str] = []
    pickle_call(withdraw.fn, (handle,), {"amount": [handle]}, passed)
    # Then it is pickled as a placeholder for its result, the job waiting for it
    assert passed == ["f-1"]  # once, however often it is passed
    with pytest.raises(TypeError, match="only as an argument of a function's call"):
        pickle.dumps(handle)
    asyncio.run(client.close())


def test_an_async_map_yields_in_order_with_a_failure_in_its_place() -> None:
    async def main() -> None:
        client, node = on_node()
        async with client:
            account = withdraw.on(client)
            # When a map of one failing call of four is read with return_exceptions
            got = [v async for v in account.map([10] * 4, [1, 2, 50, 3], return_exceptions=True)]
            # Then every value is in its item's place, the failure too, all one array
            assert got[:2] == [9, 8] and got[3] == 7 and isinstance(got[2], Overdrawn)
            assert len(node.calls) == 4 and node.cancelled == []
            # And without return_exceptions the failure is raised after every earlier result
            seen: list[int] = []
            with pytest.raises(Overdrawn, match="50 is more than 10"):
                async for value in account.map([10] * 4, [1, 2, 50, 3]):
                    seen.append(value)
            assert seen == [9, 8]
            # And unordered, every result comes; no items is no results
            assert sorted([v async for v in account.map([5, 6], [1, 1], ordered=False)]) == [4, 5]
            assert [v async for v in account.options(gpus=1).map([])] == []

    asyncio.run(main())


def test_waiting_for_a_map_leaves_the_event_loop_free_and_leaving_cancels_the_rest() -> None:
    async def main() -> None:
        client, node = on_node()
        node.release = threading.Event()
        async with client:
            results = withdraw.on(client).map([10, 10, 10], [1, 2, 3])
            # Given a map whose tasks end only once a task of this event loop says so
            first = asyncio.ensure_future(anext(results))
            await asyncio.sleep(0.05)
            assert not first.done()
            # When that task runs (it could not, were the loop held) and the first result is taken
            node.release.set()
            assert await first == 9
            # Then leaving the loop early cancels the tasks not ended
            await results.aclose()
            assert node.cancelled == [task_id("map", 1), task_id("map", 2)]

    asyncio.run(main())


def test_a_map_left_early_inside_the_clients_block_cancels_its_queued_tasks_after_it() -> None:
    async def main() -> None:
        client, node = on_node()
        # Given a map left at its first result, in the client's block, without closing it
        async with client:
            async for value in withdraw.on(client).map([10, 10, 10], [1, 2, 3]):
                assert value == 9
                break
        # When the event loop closes it, the client closed by then
        for _ in range(500):
            if node.cancelled:
                break
            await asyncio.sleep(0.01)
        # Then its tasks not ended are cancelled all the same
        assert node.cancelled == [task_id("map", 1), task_id("map", 2)]

    asyncio.run(main())


def test_a_wait_is_a_round_at_a_time_and_a_timeout_says_so() -> None:
    async def main() -> None:
        client, node = on_node()
        rounds: list[float | None] = []

        def wait(job_id: str, timeout: float | None = None) -> Job:
            rounds.append(timeout)
            raise JobTimeout("not yet")

        node.wait = wait  # type: ignore[method-assign]
        async with client:
            with pytest.raises(JobTimeout, match=r"job j-1 not final after 0\.2s"):
                await client.wait("j-1", timeout=0.2)
            assert len(rounds) == 1 and rounds[0] is not None and rounds[0] <= 0.2
            # And a wait without a timeout holds a pool thread a round at a time until cancelled
            with pytest.raises(TimeoutError) as cancelled:
                await asyncio.wait_for(client.wait("j-1"), 0.05)
            assert cancelled.type is TimeoutError and rounds[1] == WAIT_ROUND_S

    asyncio.run(main())


def test_a_map_of_one_job_per_call_is_read_from_its_futures_on_the_loop() -> None:
    async def main() -> None:
        futures: list[cf.Future[Any]] = [cf.Future() for _ in range(3)]
        futures[1].set_exception(KeyError("two"))
        # Given unordered results of calls of which only the second ended
        got = call_results(None, futures, ordered=False, return_exceptions=True)
        assert isinstance(await anext(got), KeyError)
        # When the third ends, then it is next
        futures[2].set_result(3)
        assert await anext(got) == 3
        # And leaving them early cancels the call not ended
        await got.aclose()
        assert futures[0].cancelled()

    asyncio.run(main())


def test_tasks_are_taken_in_order_or_as_they_end() -> None:
    tasks = Tasks(SimpleNamespace(), "map", 4, "f")  # type: ignore[arg-type]
    job = Job(id="x", spec=JobSpec(name="x", command=["x"]), state=JobState.SUCCEEDED)
    tasks.ended.update({1: job, 2: job})
    assert (tasks.take(ordered=True), tasks.low) == ([], 0)
    tasks.ended[0] = job
    assert (tasks.take(ordered=True), tasks.low, tasks.over) == ([0, 1, 2], 3, False)
    unordered = Tasks(SimpleNamespace(), "map", 3, "f")  # type: ignore[arg-type]
    unordered.ended.update({2: job, 1: job})
    assert (unordered.take(ordered=False), unordered.take(ordered=False), unordered.low) == ([1, 2], [], 0)
    unordered.ended[0] = job
    assert unordered.take(ordered=False) == [0] and unordered.over


def test_a_function_given_an_async_client_at_decoration_is_refused_naming_on() -> None:
    client = AsyncClient("http://127.0.0.1:9", "token")
    with pytest.raises(SpecError, match=r"client: an AsyncClient .* f\.on\(client\)"):
        fleet.function(client=client)  # type: ignore[arg-type]
    asyncio.run(client.close())
