"""Functions from asyncio (:class:`fleet.client.functions.AsyncFunction`, ``f.on(async_client)``):
:class:`AsyncFunctionHandle`, a call's handle whose ``await result()`` is the function's return value,
and a map's results as an async iterator.

Nothing is written twice: the call is pickled, uploaded and submitted by the sync
:class:`~fleet.client.functions.Function`, and an outcome read and unpickled by the sync
:class:`~fleet.client.outcomes.FunctionHandle`, each run on the :class:`~fleet.client.aio.AsyncClient`'s
thread pool with its sync client, as the AsyncClient runs what takes several calls. Only the waiting
is the event loop's: a map's array is watched a round at a time (:meth:`fleet.client.mapped.Tasks.look`,
about its ``poll_s`` on a pool thread), a map of one job per call through its futures: no thread is
held for longer than a round, a cancelled task's included.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fleet.client.aio import AsyncClient, AsyncJobHandle
from fleet.client.executor import cancel_rest
from fleet.client.outcomes import FunctionHandle

if TYPE_CHECKING:
    import concurrent.futures as cf

    from fleet.client.executor import Executor
    from fleet.client.mapped import Tasks

R = TypeVar("R")


class AsyncFunctionHandle(AsyncJobHandle, Generic[R]):
    """A call submitted from asyncio: ``await result()``, and everything an async job handle does.
    As an argument of another call it stands for this call's result, as a sync handle does."""

    def __init__(self, client: AsyncClient, handle: FunctionHandle[R]) -> None:
        super().__init__(client, handle.id)
        self.sync, self.function = handle, handle.function

    @property
    def job_id(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"AsyncFunctionHandle({self.id!r}, {self.function})"

    def __reduce__(self) -> tuple[Any, ...]:
        """A placeholder for this call's result (:meth:`FunctionHandle.__reduce__`)."""
        return self.sync.__reduce__()

    async def result(self, timeout: float | None = None) -> R:  # type: ignore[override]
        """The function's return value once the job ended; its exception raised again (with the
        node's traceback as a note); :class:`fleet.JobCancelled`, :class:`fleet.JobFailed` when the
        job ended without one; :class:`fleet.JobTimeout` after ``timeout`` seconds."""
        job = await self.wait(timeout)
        return await self.client._run(self.sync._result_of, job)


async def array_results(
    client: AsyncClient, tasks: Tasks, ordered: bool, return_exceptions: bool
) -> AsyncGenerator[Any, None]:
    """:func:`fleet.client.mapped.results` for asyncio: each round and each outcome's read on the
    pool; once this ends, is closed early, raises a call's exception or its task is cancelled, the
    tasks still queued are cancelled."""
    try:
        while True:
            for index in tasks.take(ordered):
                for call in tasks.calls_of(index):
                    yield await client._run(tasks.value, call, return_exceptions)
            if tasks.over:
                return
            await client._run(tasks.look, tasks.low)
    finally:
        if client.closed:  # a loop left early is closed by the event loop, later: maybe after the client
            await asyncio.to_thread(tasks.stop)
        else:
            await client._run(tasks.stop)


async def call_results(
    pool: Executor | None, futures: Sequence[cf.Future[Any]], ordered: bool, return_exceptions: bool
) -> AsyncGenerator[Any, None]:
    """:func:`fleet.client.executor.results` for asyncio: the futures of a map of one job per call,
    awaited on the event loop (no thread waits for them); once this ends, is closed early, raises a
    call's exception or its task is cancelled, the calls not yet running are cancelled."""
    waiting = [asyncio.wrap_future(future) for future in futures]
    try:
        for next_one in waiting if ordered else asyncio.as_completed(waiting):
            try:
                value = await next_one
            except Exception as exc:
                if not return_exceptions:
                    raise
                value = exc
            yield value
    finally:
        cancel_rest(pool, futures)
        for left in waiting:  # not the caller's now: what they come to is dropped, not logged
            if not left.done():
                left.cancel()
            elif not left.cancelled():
                left.exception()
