"""Waits and followed logs in the API: coroutines that the process's one stream read wakes.

A waiting call holds no thread and no Redis connection (``fleet.state.watch``): it sleeps until a
stream it watches grows, then reads what is new in a short call. Those short calls share at most
``WORKERS`` threads, so a burst of wake-ups never takes the threads or the Redis connections other
callers need; a call whose client hung up is cancelled and leaves the read at once (``unless_gone``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.types import Receive

from fleet.api.queries import Queries, attempt_over
from fleet.models import Job, LogLine
from fleet.state.watch import Interest, StreamWatch

T = TypeVar("T")
#: threads the waiters' short reads share (each holds a Redis connection only while it reads)
WORKERS = 16
#: a follower reads again this often even when no stream of its grew (a stream deleted meanwhile)
RECHECK_S = 10.0


class ClientGone(Exception):
    """The client hung up before the answer was ready."""


class Waiter:
    """One call's interest in some streams, and the event the read sets once one of them grew."""

    def __init__(self, interest: Interest, woken: asyncio.Event) -> None:
        self.interest, self._woken = interest, woken

    def rearm(self) -> None:
        """Forget wake-ups so far: call before reading, so one during the read is not lost."""
        self._woken.clear()

    async def woken(self, timeout: float) -> bool:
        """Whether a watched stream grew within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._woken.wait(), max(timeout, 0.0))
        except TimeoutError:
            return False
        return True


class Waiting:
    def __init__(self, backend: Queries, watch: StreamWatch) -> None:
        self.backend, self.watch = backend, watch
        self._limiter: anyio.CapacityLimiter | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:  # made on the event loop, on first use
            self._limiter = anyio.CapacityLimiter(WORKERS)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter)

    @contextmanager
    def _waiter(self) -> Iterator[Waiter]:
        loop, woken = asyncio.get_running_loop(), asyncio.Event()
        with self.watch.interest(lambda: loop.call_soon_threadsafe(woken.set)) as interest:
            yield Waiter(interest, woken)

    async def wait(self, job_id: str, timeout: float) -> Job:
        """The job once final, or as it stands after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def look(interest: Interest) -> Job:
            job, cursors = self.backend.watched_job(job_id)
            if not job.state.final:
                self.watch.want(interest, cursors)
            return job

        with self._waiter() as waiter:
            while True:
                waiter.rearm()
                job = await self._run(look, waiter.interest)
                left = deadline - loop.time()
                if job.state.final or left <= 0:
                    return job
                await waiter.woken(left)

    async def follow(
        self, job_id: str, attempt: int | None, rank: int, poll_s: float, allowed: Callable[[], bool]
    ) -> AsyncGenerator[LogLine, None]:
        """Log lines as they arrive until the attempt is over and its stream drained, or until
        ``allowed`` (asked before each read, and at least every ``poll_s``) says the reader may no
        longer read them (its token was revoked or expired)."""
        job = await self._run(self.backend.get, job_id)
        number = attempt or max(job.attempt, 1)

        def look(interest: Interest, after: str) -> tuple[Job, list[LogLine]]:
            job, lines, cursors = self.backend.watched_logs(job_id, number, rank, after)
            if not attempt_over(job, number):
                self.watch.want(interest, cursors)
            return job, lines

        cursor = "0"
        with self._waiter() as waiter:
            while await self._run(allowed):
                waiter.rearm()
                job, lines = await self._run(look, waiter.interest, cursor)
                for line in lines:
                    yield line
                cursor = lines[-1].id if lines else cursor
                if attempt_over(job, number):
                    return
                recheck = asyncio.get_running_loop().time() + RECHECK_S
                while not await waiter.woken(poll_s):
                    if asyncio.get_running_loop().time() >= recheck:
                        break
                    if not await self._run(allowed):
                        return

    async def tail(
        self, key: str, read: Callable[[bytes], list[tuple[bytes, T]]], poll_s: float
    ) -> AsyncGenerator[list[tuple[bytes, T]], None]:
        """Batches of stream ``key``'s entries as they arrive (``read(after)``: those past ``after``),
        without end; an empty batch at least every ``poll_s`` while none arrives."""

        def look(interest: Interest, after: bytes) -> list[tuple[bytes, T]]:
            got = read(after)
            self.watch.want(interest, {key: (got[-1][0] if got else after).decode()})
            return got

        cursor = b"0"
        with self._waiter() as waiter:
            while True:
                waiter.rearm()
                got = await self._run(look, waiter.interest, cursor)
                if got:
                    cursor = got[-1][0]
                else:
                    await waiter.woken(poll_s)
                yield got


async def unless_gone(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result; :class:`ClientGone`, ``work`` cancelled, once the client hangs up first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_hung_up(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        gone.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _hung_up(receive: Callable[[], Awaitable[Any]]) -> None:
    """Returns once the client hangs up (the request's body, if any, is read and dropped)."""
    while (await receive())["type"] != "http.disconnect":
        pass
