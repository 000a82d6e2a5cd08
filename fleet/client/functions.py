"""Functions on the fleet: ``@fleet.function(gpus=1, workdir=".")`` on a module-level function makes
``f.submit(*args, **kwargs)`` run it as a job and return a :class:`FunctionHandle`, whose
``result()`` is the function's return value (or its exception, raised again here); ``f(*args)``
still runs it here, unchanged; ``f.map(items)`` makes one call per item, all one job array
(:mod:`fleet.client.mapped`). ``f.on(async_client)`` is the same function for asyncio
(:class:`AsyncFunction`, :mod:`fleet.client.aio_functions`).

The call travels as one content-addressed blob through the API (``PUT /v1/blobs``): the function
(pickled by value when it is defined in a script, else named by module and qualified name and
imported on the node from the shipped ``workdir``) and its arguments, pickled with cloudpickle
behind a header naming the caller's Python and cloudpickle, so a job whose own differ says so in
words. An argument that cannot be pickled is refused here, naming it, before anything is sent. The
node hands the blob to the job without reading it; the job's runner (``python3 -m
fleet_worker.call``) makes the call and leaves the outcome with the job's kept outputs, where
``result()`` reads it (:mod:`fleet.client.outcomes`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar, overload

from fleet.client import checks
from fleet.client.outcomes import FunctionHandle
from fleet.client.pickled import (
    CALL_MAX_BYTES,
    call_spec,
    check_module_level,
    check_own,
    default_client,
    job_fields,
)
from fleet.errors import SpecError

if TYPE_CHECKING:
    import concurrent.futures as cf

    from fleet.client.aio import AsyncClient
    from fleet.client.aio_functions import AsyncFunctionHandle
    from fleet.client.executor import Executor
    from fleet.client.mapped import Tasks
    from fleet.client.sync import Client

    #: a map's calls sent one job per call: the executor that sent them, and their futures
    Calls = tuple[Executor | None, list[cf.Future[Any]]]

P = ParamSpec("P")
R = TypeVar("R")


class Function(Generic[P, R]):
    """A function that runs here when called and on the fleet with :meth:`submit`."""

    #: what ``fleet.Executor`` looks for to submit the function itself (it does not import this)
    _fleet_function = True

    def __init__(
        self, fn: Callable[P, R], python: str, client: Client | None, fields: dict[str, Any]
    ) -> None:
        self.fn, self.python, self.client, self.fields = fn, python, client, fields
        functools.update_wrapper(self, fn)
        self._spec(None)  # a bad field is refused at decoration, naming it

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"fleet.function({self.name})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (a function defined beside it refers to it) without its client."""
        return (Function, (self.fn, self.python, None, self.fields))

    @overload
    def on(self, client: Client) -> Function[P, R]: ...
    @overload
    def on(self, client: AsyncClient) -> AsyncFunction[P, R]: ...

    def on(self, client: Client | AsyncClient) -> Function[P, R] | AsyncFunction[P, R]:
        """The same function, submitted with ``client`` (another API or token); with an
        :class:`fleet.AsyncClient`, the same function for asyncio (:class:`AsyncFunction`)."""
        from fleet.client.aio import AsyncClient

        if isinstance(client, AsyncClient):
            return AsyncFunction(Function(self.fn, self.python, client.sync, self.fields), client)
        return Function(self.fn, self.python, client, self.fields)

    def options(self, *, python: str | None = None, **fields: Any) -> Function[P, R]:
        """The same function with other spec fields (``gpus=4``, ``image=...``) or interpreter."""
        check_own(fields, python or self.python)
        return Function(self.fn, python or self.python, self.client, {**self.fields, **fields})

    @property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> FunctionHandle[R]:
        """Run the call as a job; its handle. Nothing is sent when an argument cannot be pickled.
        ``after=[h1, h2]`` (a keyword fleet takes, not passed to the function): the jobs it waits for."""
        client = self.client or default_client()
        after: Any = kwargs.pop("after", None)
        spec = call_spec(client, self.fn, self.python, self.fields, args, kwargs)
        handle = client.submit(spec, after=after)
        return FunctionHandle(client, handle.id, self.name)

    @overload
    def map(
        self,
        *iterables: Iterable[Any],
        max_running: int | None = None,
        chunksize: int = 1,
        ordered: bool = True,
        return_exceptions: Literal[False] = False,
        after: Iterable[object] | None = None,
    ) -> Iterator[R]: ...
    @overload
    def map(
        self,
        *iterables: Iterable[Any],
        max_running: int | None = None,
        chunksize: int = 1,
        ordered: bool = True,
        return_exceptions: Literal[True],
        after: Iterable[object] | None = None,
    ) -> Iterator[R | Exception]: ...

    def map(
        self,
        *iterables: Iterable[Any],
        max_running: int | None = None,
        chunksize: int = 1,
        ordered: bool = True,
        return_exceptions: bool = False,
        after: Iterable[object] | None = None,
    ) -> Iterator[R] | Iterator[R | Exception]:
        """One call per item (``f.map(xs, ys)`` calls ``f(x, y)``, as the built-in ``map``), all of
        them one job array (task ``i`` makes call ``i``); the results as an iterator, in the order of
        the items (``ordered=False``: as the calls end). Every call is pickled and sent before this
        returns (an argument that cannot be pickled is refused, naming it, and nothing runs).
        ``max_running``: most tasks on nodes at once (the array's; the rest wait in the queue). A
        call that raised is raised again in its place, after every earlier result, and the calls
        still queued are cancelled; with ``return_exceptions=True`` its exception is yielded in its
        place instead and every call runs. Closing the iterator early cancels the calls still queued.
        ``chunksize``: calls each task makes, one after another in one process (as
        ``ProcessPoolExecutor.map``'s): task ``i`` makes calls ``i*N`` to ``i*N+N-1``, each call's
        result (or exception) kept and yielded in its place; a task one of whose calls raised ends
        FAILED, and an attempt run again makes all its calls again.
        ``after``: jobs every call waits for (as :meth:`submit`'s). An item that is a call's handle
        is that call's result, waited for: such a map (or one whose calls pickle to more than
        :data:`fleet.client.mapped.MAP_BLOB_MAX` in all) is one job per call whatever
        ``chunksize``, sent in batches, with at most ``max_running`` queued or running
        (:class:`fleet.Executor`'s way)."""
        from fleet.client import executor, mapped

        sent = self._send_map(iterables, max_running, chunksize, after)
        if isinstance(sent, mapped.Tasks):
            return mapped.results(sent, ordered, return_exceptions)
        return executor.results(*sent, ordered, return_exceptions)

    def _send_map(
        self,
        iterables: tuple[Iterable[Any], ...],
        max_running: int | None,
        chunksize: int,
        after: Iterable[object] | None,
    ) -> Tasks | Calls:
        """:meth:`map`'s calls pickled and sent: one array's tasks, or (a map that goes one job per
        call) an executor's futures of them, in the items' order (none for no items)."""
        from fleet.client import mapped

        deps = checks.after(after)
        most = None if max_running is None else checks.count(max_running, "max_running")
        each = checks.chunksize(chunksize)
        fields = {**self.fields, "after": [*self.fields.get("after", []), *deps]} if deps else self.fields
        items = list(zip(*iterables, strict=False))
        if not items:
            return None, []
        blob = mapped.calls_blob(self.fn, items, each)
        if blob is None:
            return self._map_jobs(fields, items, most)
        client = self.client or default_client()
        call = mapped.call_of(self.fn, client.upload_blob(blob), items, each)
        spec = job_fields(self.fn, self.python, fields, call)
        array = client.submit_array(spec, range(-(-len(items) // each)), max_running=most)
        return mapped.Tasks(client, array.id, len(items), self.name, each)

    def _map_jobs(self, fields: dict[str, Any], items: list[tuple[Any, ...]], most: int | None) -> Calls:
        """:meth:`map`'s calls as one job per call, through an executor."""
        from fleet.client.executor import Executor

        executor = Executor._for(fields, self.python, self.client, most)
        try:
            futures = [executor.submit(self.fn, *args) for args in items]
        except BaseException:
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        executor.shutdown(wait=False)
        return executor, futures

    def _spec(self, call: dict[str, Any] | None) -> dict[str, Any]:
        """The job spec of a call (checked: :class:`SpecError` naming a bad field)."""
        return job_fields(self.fn, self.python, self.fields, call)


class AsyncFunction(Generic[P, R]):
    """A :class:`Function` for asyncio, submitted with a :class:`fleet.AsyncClient`
    (``f.on(async_client)``): ``h = await af.submit(x)`` then ``await h.result()``, and ``async for
    value in af.map(xs)``. Pickling, uploading and sending run on the client's thread pool (the sync
    function's own code), waiting on the event loop: nothing here blocks the loop."""

    def __init__(self, function: Function[P, R], client: AsyncClient) -> None:
        self.sync, self.client = function, client

    def __repr__(self) -> str:
        return f"fleet.function({self.name}).on({self.client.url})"

    @property
    def name(self) -> str:
        return self.sync.name

    def options(self, *, python: str | None = None, **fields: Any) -> AsyncFunction[P, R]:
        """The same function with other spec fields or interpreter (:meth:`Function.options`)."""
        return AsyncFunction(self.sync.options(python=python, **fields), self.client)

    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> AsyncFunctionHandle[R]:
        """Run the call as a job (:meth:`Function.submit`, ``after=`` too); its handle, whose
        ``await result()`` is the return value. A handle of either kind may be an argument."""
        from fleet.client.aio_functions import AsyncFunctionHandle

        handle = await self.client._run(functools.partial(self.sync.submit, *args, **kwargs))
        return AsyncFunctionHandle(self.client, handle)

    @overload
    def map(
        self,
        *iterables: Iterable[Any],
        max_running: int | None = None,
        chunksize: int = 1,
        ordered: bool = True,
        return_exceptions: Literal[False] = False,
        after: Iterable[object] | None = None,
    ) -> AsyncGenerator[R, None]: ...
    @overload
    def map(
        self,
        *iterables: Iterable[Any],
        max_running: int | None = None,
        chunksize: int = 1,
        ordered: bool = True,
        return_exceptions: Literal[True],
        after: Iterable[object] | None = None,
    ) -> AsyncGenerator[R | Exception, None]: ...

    def map(
        self,
        *iterables: Iterable[Any],
        max_running: int | None = None,
        chunksize: int = 1,
        ordered: bool = True,
        return_exceptions: bool = False,
        after: Iterable[object] | None = None,
    ) -> AsyncGenerator[R, None] | AsyncGenerator[R | Exception, None]:
        """``async for value in af.map(xs)``: :meth:`Function.map`, with the same arguments and
        results (in order, or as they end; a call's exception raised in its place, or yielded with
        ``return_exceptions=True``; the calls still queued cancelled on a failure, when the loop is
        left early or its task cancelled). The calls are pickled and sent when the loop first asks
        for a result (an argument that cannot be pickled is raised there)."""
        return self._map(iterables, max_running, chunksize, ordered, return_exceptions, after)

    async def _map(
        self,
        iterables: tuple[Iterable[Any], ...],
        max_running: int | None,
        chunksize: int,
        ordered: bool,
        return_exceptions: bool,
        after: Iterable[object] | None,
    ) -> AsyncGenerator[Any, None]:
        from fleet.client.aio_functions import array_results, call_results
        from fleet.client.mapped import Tasks

        sent = await self.client._run(self.sync._send_map, iterables, max_running, chunksize, after)
        if isinstance(sent, Tasks):
            results = array_results(self.client, sent, ordered, return_exceptions)
        else:
            results = call_results(*sent, ordered, return_exceptions)
        async with contextlib.aclosing(results):
            async for value in results:
                yield value


def check_sync(client: object) -> None:
    """A function's own client is a :class:`fleet.Client`: an AsyncClient is given with ``on``."""
    from fleet.client.aio import AsyncClient

    if isinstance(client, AsyncClient):
        raise SpecError(
            "client: an AsyncClient submits a function from asyncio as f.on(client); give "
            "fleet.function a fleet.Client, or none"
        )


@overload
def function(fn: Callable[P, R], /) -> Function[P, R]: ...
@overload
def function(
    *, python: str = "python3", client: Client | None = None, **fields: Any
) -> Callable[[Callable[P, R]], Function[P, R]]: ...


def function(
    fn: Callable[P, R] | None = None,
    /,
    *,
    python: str = "python3",
    client: Client | None = None,
    **fields: Any,
) -> Function[P, R] | Callable[[Callable[P, R]], Function[P, R]]:
    """``@fleet.function`` or ``@fleet.function(gpus=1, image=..., workdir=".", timeout="2h", ...)``:
    any :class:`fleet.JobSpec` field but ``command``. ``python``: the program that runs the call on
    the node (it needs cloudpickle and fleet_worker: fleet's images and environment have them).
    ``client``: the :class:`fleet.Client` to submit with (default: one made from the environment).
    A function job makes one attempt unless ``max_attempts`` says more (a node lost or drained
    requeues it all the same, without counting)."""
    check_own(fields, python)
    if client is not None:
        check_sync(client)

    def wrap(target: Callable[P, R]) -> Function[P, R]:
        check_module_level(target)
        return Function(target, python, client, fields)

    return wrap if fn is None else wrap(fn)


__all__ = ["CALL_MAX_BYTES", "AsyncFunction", "Function", "FunctionHandle", "function"]
