"""``f.map`` as one job array (:mod:`fleet.client.functions`): every call's arguments pickled into one
blob beside the function, pickled once (``fleet_worker.formats.pack_calls``), and one array of a task
per call, task ``i`` making call ``i`` (its runner finds its own arguments by ``FLEET_ARRAY_INDEX``),
at most ``max_running`` of them on nodes at once (the array's own limit, kept by the scheduler).
With ``chunksize`` N the array has a task per N calls, task ``i`` making calls ``i*N`` to
``i*N+N-1`` one after another in one process, each call's outcome kept (``fleet-outcomes 1``).

Each task's outcome is read as a single call's is (:class:`FunctionHandle`), once, and each of its
calls' results yielded in its place. The tasks are watched with a long-poll on the first not seen
ended and the array's counts each round, and a listing of its tasks (by their ``fleet.array`` label)
only in a round where more of them ended than were seen.

A map goes one job per call instead (:func:`calls_blob` returns None; ``chunksize`` is then not
used) when an item holds a call's handle (each call then waits for its own inputs, not every task
for all of them), when its calls pickle to more than :data:`MAP_BLOB_MAX` in all (each task's node
reads the whole blob to hand the task its calls), or when there are more tasks than an array holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from fleet.client.outcomes import PASSED, FunctionHandle
from fleet.client.pickled import CALL_MAX_BYTES, _culprit, summary
from fleet.errors import JobTimeout, SpecError
from fleet.models import FINAL_STATES, Job
from fleet.models.arrays import ARRAY_LABEL, ARRAY_TASKS_MAX, task_id
from fleet_worker.formats import pack_calls, versions

if TYPE_CHECKING:
    from fleet.client.sync import Client

#: most bytes of one map's calls (pickled) sent as one array's blob; a larger map is one job per call
MAP_BLOB_MAX = 16 << 20
#: most task ids one bulk cancel names
CANCEL_BATCH = 10_000
#: items ``fleet show`` tells of a map's call (the summary is cut at 1,000 characters)
SHOWN = 5


def calls_blob(
    fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], chunksize: int = 1, first: int = 0
) -> bytes | None:
    """The calls ``fn(*item)`` in one blob, ``chunksize`` of them a task, or None when the map goes
    one job per call (an item holds a call's handle; too many tasks, or too many bytes).
    :class:`SpecError` naming an argument that cannot be pickled, or an item larger than a call may
    be. ``first``: the number of the first item among the map's (``fleet.Executor.map``'s chunks)."""
    import cloudpickle

    if -(-len(items) // chunksize) > ARRAY_TASKS_MAX:
        return None
    by_value = fn.__module__ == "__main__" or "<" in fn.__qualname__
    function = cloudpickle.dumps(fn) if by_value else b""
    calls: list[bytes] = []
    total = len(function)
    for number, args in enumerate(items):
        passed: list[str] = []
        token = PASSED.set(passed)
        try:
            call = cloudpickle.dumps((args, {}))
        except Exception as exc:
            raise SpecError(f"item {first + number}: {_culprit(fn, args, {}, exc)}") from exc
        finally:
            PASSED.reset(token)
        if passed:
            return None
        if len(call) > CALL_MAX_BYTES:
            raise SpecError(
                f"item {first + number}: {fn.__qualname__}'s arguments pickle to {len(call)} bytes, more "
                f"than {CALL_MAX_BYTES}; pass a path the job can read (a mount, its workdir) instead of the "
                "data"
            )
        total += len(call)
        if total > MAP_BLOB_MAX:
            return None
        calls.append(call)
    header = {**versions(), "module": fn.__module__, "qualname": fn.__qualname__}
    if first:
        header["first"] = first
    packed: bytes = pack_calls(header, function, calls, chunksize)
    return packed


def call_of(
    fn: Callable[..., Any],
    blob: str,
    items: Sequence[tuple[Any, ...]],
    chunksize: int = 1,
    first: int | None = None,
) -> dict[str, Any]:
    """The array's ``call`` (or, with ``first``, that of a job of ``fleet.Executor.map``'s chunks):
    its blob, and what ``fleet show`` tells of its arguments."""
    shown = ", ".join(f"({summary(args, {})})" for args in items[:SHOWN])
    more = ", ..." if len(items) > SHOWN else ""
    if first is not None:
        args = f"*item for item in items[{first}:{first + len(items)}]: {shown}{more}"
    elif chunksize == 1:
        args = f"*item[FLEET_ARRAY_INDEX] of {len(items)}: {shown}{more}"
    else:
        every = f"FLEET_ARRAY_INDEX*{chunksize}"
        args = f"*item for item in items[{every}:{every}+{chunksize}] of {len(items)}: {shown}{more}"
    return {
        "blob": blob,
        "function": f"{fn.__module__}.{fn.__qualname__}",
        "args": args if len(args) <= 1000 else args[:997] + "...",
    }


class Tasks:
    """A map's array as it is watched: each task's handle, and the tasks seen ended. Call ``c`` is
    task ``c // chunksize``'s call ``c % chunksize``."""

    def __init__(
        self,
        client: Client,
        array_id: str,
        calls: int,
        function: str,
        chunksize: int = 1,
        poll_s: float = 1.0,
    ):
        self.client, self.id, self.poll, self.calls, self.each = client, array_id, poll_s, calls, chunksize
        size = -(-calls // chunksize)
        self.handles = [FunctionHandle[Any](client, task_id(array_id, i), function) for i in range(size)]
        self.ended: dict[int, Job] = {}
        self.given: set[int] = set()  # the tasks whose results were given
        self._low = 0

    @property
    def low(self) -> int:
        """The lowest index not seen ended (the size once all are)."""
        while self._low < len(self.handles) and self._low in self.ended:
            self._low += 1
        return self._low

    @property
    def over(self) -> bool:
        """Whether every task's results were given."""
        return len(self.given) == len(self.handles)

    def take(self, ordered: bool) -> list[int]:
        """The tasks whose results may be given now, marked given: those seen ended and not given
        (``ordered``: only those before the lowest not seen ended). The one to :meth:`look` for
        next, either way, is :attr:`low`."""
        fresh = range(len(self.given), self.low) if ordered else sorted(self.ended.keys() - self.given)
        self.given.update(fresh)
        return list(fresh)

    def calls_of(self, index: int) -> range:
        """The calls task ``index`` makes."""
        return range(index * self.each, min(index * self.each + self.each, self.calls))

    def look(self, first: int) -> None:
        """One round: wait for task ``first`` (at most ``poll_s``), then, if more tasks ended than
        were seen, read those from the lowest index not seen ended on (tasks list newest first, and
        a task's seq follows its index, so those are the first listed)."""
        with contextlib.suppress(JobTimeout):
            self.ended[first] = self.client.wait(self.handles[first].id, self.poll)
        counts = self.client.array(self.id).tasks
        if sum(counts.get(s, 0) for s in FINAL_STATES) <= len(self.ended) or self.low >= len(self.handles):
            return
        listed = self.client.jobs(labels={ARRAY_LABEL: self.id}, limit=len(self.handles) - self.low)
        for job in listed:
            index = job.array_index
            if job.state.final and index is not None and 0 <= index < len(self.handles):
                self.ended.setdefault(index, job)

    def value(self, call: int, return_exceptions: bool) -> Any:
        """Call ``call``'s result; its exception raised, or returned with ``return_exceptions``. A
        task's outcome is let go once its last call's result is taken."""
        index, number = divmod(call, self.each)
        handle = self.handles[index]
        try:
            return handle._call_of(self.ended[index], number)
        except Exception as exc:
            if not return_exceptions:
                raise
            return exc
        finally:
            if call == self.calls_of(index)[-1]:
                handle._forget()

    def stop(self) -> None:
        """Cancel the tasks not seen ended that are still queued (those on nodes run on), unless
        every task was seen ended: once the results end, are left early, or raise a call's exception."""
        if len(self.ended) == len(self.handles):
            return
        left = [h.id for i, h in enumerate(self.handles) if i not in self.ended]
        for start in range(0, len(left), CANCEL_BATCH):
            self.client.cancel_jobs(left[start : start + CANCEL_BATCH], state="QUEUED")


def results(tasks: Tasks, ordered: bool, return_exceptions: bool) -> Iterator[Any]:
    """The calls' results in their order (``ordered``) or as their tasks end (a task's in order);
    once this ends, is closed early, or raises a call's exception, the tasks still queued are
    cancelled."""
    try:
        while True:
            for index in tasks.take(ordered):
                for call in tasks.calls_of(index):
                    yield tasks.value(call, return_exceptions)
            if tasks.over:
                return
            tasks.look(tasks.low)
    finally:
        tasks.stop()
