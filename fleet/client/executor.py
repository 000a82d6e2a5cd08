"""``fleet.Executor``: the fleet as a :class:`concurrent.futures.Executor`, so that code written for
``ProcessPoolExecutor`` or submitit moves with one line changed. ``submit(fn, *args, **kwargs)``
makes the call a job, as a :class:`fleet.function`'s ``submit`` does, and returns a real
:class:`concurrent.futures.Future`: ``add_done_callback``, ``as_completed`` and ``wait`` from the
standard library work on it.

Calls are pickled and uploaded in the caller's thread (an argument that cannot be pickled is refused
there, naming it); one background thread per executor queues them in batches (``submit_many``), at
most ``max_running`` queued or running at once, and resolves their futures. It watches them all
with two calls a round, not one per job: a long-poll on the oldest job still out (``wait``, which
returns as soon as that job ends), then one listing of the executor's jobs by the label
:data:`LABEL` that each of them carries: its newest, as many as are out and :data:`SLACK` more
(jobs end about in the order they were sent, so those out are the newest), or all of them in a
round where a job out is older than that. A future stays pending while its job is queued (so
``cancel()`` works, and cancels the job), runs once the job is placed, and holds the function's
return value or exception once the job ended (:meth:`fleet.FunctionHandle.result`'s).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.client import checks, mapped
from fleet.client.endpoints import MAX_BATCH
from fleet.client.outcomes import FunctionHandle
from fleet.client.pickled import call_spec, check_own, default_client, job_fields
from fleet.errors import JobTimeout, SpecError
from fleet.models import Job

if TYPE_CHECKING:
    from fleet.client.sync import Client

#: the label every job of an executor carries (its value names the executor): how it finds them
LABEL = "fleet-executor"
#: consecutive rounds the watcher may fail (the API unreachable) before it fails every future
FAILURES_MAX = 5
#: jobs a round's listing reads beyond those out, for jobs that ended out of order
SLACK = 100
T = TypeVar("T")


@dataclass
class _Call:
    """A call pickled and uploaded, waiting here for room to be queued."""

    future: cf.Future[Any]
    spec: dict[str, Any]
    function: str
    #: the calls of a job of ``map``'s chunks (its future's result: a function of each call's
    #: result), or 0: a job of one call (its future's result: the call's)
    calls: int = 0


class Executor(cf.Executor):
    """Runs each call as a job on the fleet: ``fleet.Executor(gpus=1, image=..., workdir=".")``,
    with any :class:`fleet.JobSpec` field but ``command``. ``python``: the program that runs a call
    on the node. ``client``: the :class:`fleet.Client` to submit with (default: one from the
    environment). ``max_running``: most calls queued or running at once (the rest wait here).
    ``poll_s``: longest a round of watching waits before looking at every job again."""

    def __init__(
        self,
        gpus: int = 1,
        *,
        python: str = "python3",
        client: Client | None = None,
        max_running: int | None = None,
        poll_s: float = 1.0,
        **fields: Any,
    ) -> None:
        check_own(fields, python)
        self._python, self._client, self._fields = python, client, {"gpus": gpus, **fields}
        self._most = None if max_running is None else checks.count(max_running, "max_running")
        self._poll = checks.seconds(poll_s, "poll_s") or 1.0
        self._tag = uuid.uuid4().hex[:16]
        self._fields["labels"] = {**dict(self._fields.get("labels") or {}), LABEL: self._tag}
        job_fields(_probe, python, self._fields, None)  # a bad field is refused here, naming it
        self._lock = threading.Condition()
        self._held: list[_Call] = []
        self._sending: list[_Call] = []  # being queued: a cancel here is done once they are out
        self._out: dict[str, tuple[cf.Future[Any], FunctionHandle[Any]]] = {}
        self._chunks: dict[str, int] = {}  # the calls of each job out that makes several
        self._sent = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def _for(
        cls, fields: dict[str, Any], python: str, client: Client | None, max_running: int | None
    ) -> Executor:
        """An executor of a ``fleet.function``'s job fields (``Function.map``'s)."""
        rest = {k: v for k, v in fields.items() if k != "gpus"}
        return cls(fields.get("gpus", 0), python=python, client=client, max_running=max_running, **rest)

    def __repr__(self) -> str:
        return f"fleet.Executor({LABEL}={self._tag})"

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """A future of ``fn(*args, **kwargs)`` run as a job (``fn``: a function, ``fleet.function``'s
        or not, that cloudpickle can pickle)."""
        target = _target(fn, "submit")
        self._check_open()
        spec = call_spec(self.client, target, self._python, self._fields, args, kwargs)
        return self._hold(spec, 0)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]:
        """The standard library's ``map``: ``fn(*item)`` of each item, the results in order, the
        first exception raised in its place (the calls after it cancelled where still queued),
        :class:`TimeoutError` once ``timeout`` seconds from this call passed. ``chunksize`` N: each
        job makes N calls one after another, in one process (``ProcessPoolExecutor``'s meaning), and
        ``max_running`` counts jobs; a map whose items hold a call's handle makes a job per call."""
        end = None if timeout is None else time.monotonic() + timeout
        each = checks.chunksize(chunksize)
        if each == 1:
            return super().map(fn, *iterables, timeout=timeout)
        target, items = _target(fn, "map"), list(zip(*iterables, strict=False))
        starts = range(0, len(items), each)
        blobs = [mapped.calls_blob(target, items[s : s + each], each, s) for s in starts]
        packed = [blob for blob in blobs if blob is not None]
        if len(packed) < len(blobs):  # an item holds a call's handle: its call waits for that job alone
            return super().map(fn, *zip(*items, strict=True), timeout=timeout)
        self._check_open()
        futures = []
        for start, blob in zip(starts, packed, strict=True):
            chunk = items[start : start + each]
            call = mapped.call_of(target, self.client.upload_blob(blob), chunk, each, start)
            futures.append(self._hold(job_fields(target, self._python, self._fields, call), len(chunk)))
        return _chunk_results(futures, end)

    def _check_open(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")

    def _hold(self, spec: dict[str, Any], calls: int) -> cf.Future[Any]:
        """A future of the job of ``spec``, held here until there is room to queue it."""
        future: cf.Future[Any] = cf.Future()
        with self._lock:
            self._held.append(_Call(future, spec, str(spec["call"]["function"]), calls))
            self._start()
            self._lock.notify_all()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls; with ``cancel_futures``, cancel every future whose job is not running yet
        (and that job); with ``wait``, return once every other future is resolved."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                for call in self._held + self._sending:
                    call.future.cancel()
                for future, _ in self._out.values():
                    future.cancel()  # its job is cancelled by the watcher
            thread = self._thread
            self._lock.notify_all()
        if wait and thread is not None:
            thread.join()

    @property
    def client(self) -> Client:
        return self._client or default_client()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name=f"fleet-executor-{self._tag}", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        """The watcher's loop: queue what there is room for, cancel what was cancelled here, and
        resolve what ended, until shut down with nothing left out."""
        failures = 0
        try:
            while self._busy():
                try:
                    self._round()
                    failures = 0
                except Exception as exc:  # the API unreachable: try again, then give up on every future
                    failures += 1
                    if failures >= FAILURES_MAX:
                        self._fail_all(exc)
                    else:
                        threading.Event().wait(self._poll)
        finally:
            self.client.transport.close()  # this thread's connection

    def _round(self) -> None:
        self._send()
        self._drop_cancelled()
        self._look()

    def _busy(self) -> bool:
        """Whether there is work; waits here for some while there is none."""
        with self._lock:
            while not self._held and not self._out and not self._closed:
                self._lock.wait()
            return bool(self._held or self._out)

    def _send(self) -> None:
        """Queue held calls, up to ``max_running`` out at once, in batches of ``submit_many``."""
        with self._lock:
            self._held = [c for c in self._held if not c.future.cancelled()]
            room = len(self._held) if self._most is None else max(0, self._most - len(self._out))
            batch, self._held = self._held[: min(room, MAX_BATCH)], self._held[min(room, MAX_BATCH) :]
            self._sending = batch
        if not batch:
            return
        handles, refused = [], None
        try:
            handles = self.client.submit_many([c.spec for c in batch])
        except Exception as exc:  # refused (a quota, a spec): each of these calls says so
            refused = exc
        with self._lock:
            self._sending = []
            self._sent += len(handles)
            for call, handle in zip(batch, handles, strict=False):
                self._out[handle.id] = (call.future, FunctionHandle(self.client, handle.id, call.function))
                if call.calls:
                    self._chunks[handle.id] = call.calls
        if refused is not None:
            for call in batch:
                _resolve(call.future, functools.partial(_raise, refused))

    def _drop_cancelled(self) -> None:
        """Cancel the jobs of futures cancelled here (by ``cancel()`` or ``shutdown``)."""
        with self._lock:
            gone = [job_id for job_id, (future, _) in self._out.items() if future.cancelled()]
            for job_id in gone:
                del self._out[job_id]
                self._chunks.pop(job_id, None)
        for start in range(0, len(gone), 10_000):
            self.client.cancel_jobs(gone[start : start + 10_000])

    def _look(self) -> None:
        """One round: wait for the oldest job out (at most ``poll_s``), then read every other job out:
        the newest, as many as are out and ``SLACK`` more; all of them when that missed one (a
        listing of every job the executor sent grows with the calls made, not with those out)."""
        with self._lock:
            oldest = next(iter(self._out), None)
            if oldest is None or (self._held and self._room()):
                return
            count, out = self._sent, len(self._out)
        with contextlib.suppress(JobTimeout):  # not ended yet: look at the others all the same
            self._update(self.client.wait(oldest, self._poll))
        jobs = self._listed(min(out + SLACK, count))
        with self._lock:
            missed = not self._out.keys() - {oldest} <= {job.id for job in jobs}
        if missed and len(jobs) < count:
            jobs = self._listed(count)
        for job in jobs:
            self._update(job)

    def _listed(self, most: int) -> list[Job]:
        """The executor's newest ``most`` jobs."""
        return self.client.jobs(labels={LABEL: self._tag}, limit=min(max(most, 1), 100_000))

    def _room(self) -> bool:
        return self._most is None or len(self._out) < self._most

    def _update(self, job: Job) -> None:
        with self._lock:
            entry = self._out.get(job.id)
            if entry is None:
                return
            calls = self._chunks.pop(job.id, 0) if job.state.final else 0
            if job.state.final:
                del self._out[job.id]
                self._lock.notify_all()
        future, handle = entry
        if calls:
            _resolve(future, lambda: _each_call(handle, job, calls))
        elif job.state.final:
            _resolve(future, lambda: handle._result_of(job))
        elif job.state.on_node and not future.running():
            future.set_running_or_notify_cancel()  # False: cancelled here; the next round cancels the job

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            futures = [c.future for c in self._held] + [f for f, _ in self._out.values()]
            self._held, self._out, self._chunks = [], {}, {}
        for future in futures:
            _resolve(future, functools.partial(_raise, error))


def _resolve(future: cf.Future[Any], outcome: Callable[[], Any]) -> None:
    """Set ``future`` to what ``outcome()`` returns or raises (unless it was cancelled)."""
    if not future.running() and not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(outcome())
    except Exception as exc:
        future.set_exception(exc)


def _raise(error: Exception) -> Any:
    raise error


def _target(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """The function a call runs: a ``fleet.function``'s own."""
    target = fn.fn if getattr(fn, "_fleet_function", False) else fn  # type: ignore[attr-defined]
    if not callable(target):
        raise SpecError(f"Executor.{what}: fn {target!r} is not callable; pass the function to run")
    return target


def _each_call(handle: FunctionHandle[Any], job: Job, calls: int) -> list[Callable[[], Any]]:
    """A job of ``map``'s chunks as its future holds it: a function of each call's result (or
    exception), its outcome read here, once (a read that failed is tried again by each)."""
    with contextlib.suppress(Exception):
        handle._outcome_of(job)
    return [functools.partial(handle._call_of, job, number) for number in range(calls)]


def _chunk_results(futures: list[cf.Future[Any]], end: float | None) -> Iterator[Any]:
    """``map``'s results from its jobs of several calls, in order, as the standard library's
    ``map`` gives them: a call's exception raised in its place; once this ends, is closed, or
    raises, the jobs not yet running are cancelled."""
    try:
        for number, future in enumerate(futures):
            try:
                calls = future.result(None if end is None else end - time.monotonic())
            except cf.TimeoutError:
                future.cancel()
                raise
            futures[number] = cf.Future()  # let go of the calls' results once taken
            for call in calls:
                yield call()
    finally:
        for future in futures:
            future.cancel()


def _probe() -> None:
    """Stands in for a call when an executor's job fields are checked."""


def results(
    executor: Executor | None, futures: Sequence[cf.Future[Any]], ordered: bool, return_exceptions: bool
) -> Iterator[Any]:
    """The results of ``futures`` in their order (or as they end), for ``Function.map``: a failed
    call's exception raised in its place, or with ``return_exceptions`` yielded in its place.
    Once this ends, or is closed early, the calls not yet running are cancelled."""
    try:
        for future in futures if ordered else cf.as_completed(futures):
            try:
                value = future.result()
            except Exception as exc:
                if not return_exceptions:
                    raise
                value = exc
            yield value
    finally:
        cancel_rest(executor, futures)


def cancel_rest(executor: Executor | None, futures: Sequence[cf.Future[Any]]) -> None:
    """Cancel the calls of a map not yet running: the executor's (and their jobs), or each future."""
    if executor is not None:
        executor.shutdown(wait=False, cancel_futures=True)
    else:
        for future in futures:
            future.cancel()
