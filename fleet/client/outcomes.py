"""What a function job came to (:mod:`fleet.client.functions`): :class:`FunctionHandle`, whose
``result()`` waits for the job (through its requeues), then reads the outcome its runner left with
the final attempt's kept outputs (``fleet_worker.call``) and unpickles it here, in the caller's
process: the return value, or the function's exception raised again with the node's traceback
attached as a note. A fleet error comes only for what is not the function's own doing: the job
cancelled (:class:`JobCancelled`), or failed without an outcome, as a time limit or a node lost past
its retries end it, or with a call that could not be made (:class:`JobFailed`, saying why).

A map's task of several calls (``chunksize``) leaves each call's outcome in turn
(:class:`Outcomes`): ``f.map`` reads it once and yields each call's result in its place; a call the
task did not end (killed midway) is a :class:`JobFailed` naming its item; ``result()`` of such a
task is the list of its calls' values, or the first exception. An outcome in a format this release
does not know is a :class:`FleetError` saying so.

A handle passed as an argument of another call (``g.submit(f.submit(x))``, or inside a list, tuple,
dict or object among its arguments) stands there for the call's result, without its coming back
here: pickled, it is a placeholder the job's runner replaces with that result (see
:data:`PASSED`), and the call waits for the job to succeed.
"""

from __future__ import annotations

import tempfile
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from fleet.client.handles import JobHandle, Source
from fleet.errors import FleetError, JobCancelled, JobFailed, NotFound, RemoteError
from fleet.models import Job, JobState
from fleet_worker.call import result_of
from fleet_worker.formats import (
    FOLDER,
    OUTCOME,
    OUTCOME_MAGIC,
    OUTCOMES_MAGIC,
    RAISED,
    RETURNED,
    read_outcomes,
    unpack,
)

R = TypeVar("R")
#: while a call is pickled (``fleet.client.pickled.pickle_call``): the ids of the jobs whose handles
#: its arguments hold, each pickled as a placeholder for its result; None otherwise
PASSED: ContextVar[list[str] | None] = ContextVar("fleet_passed", default=None)


class Outcome:
    """An outcome file: its header (status, versions, the exception in words) and its pickle."""

    def __init__(self, data: bytes) -> None:
        self.header, self.payload = unpack(OUTCOME_MAGIC, data)
        self.status = str(self.header.get("status", ""))

    def value(self, job: Job, function: str) -> Any:
        """The return value; the function's exception raised; :class:`JobFailed` for a call that
        was not made."""
        if self.status == RETURNED:
            try:
                return self._loads()
            except Exception as exc:
                raise FleetError(
                    f"job {job.id}: {function}'s return value cannot be rebuilt here ({type(exc).__name__}: "
                    f"{str(exc)[:300]}); {_fix(exc)}"
                ) from exc
        if self.status == RAISED:
            raise self._exception()
        why = self.header.get("message", "no reason given")
        raise JobFailed(job, f"job {job.id} FAILED: {function} was not called: {why}")

    def _loads(self) -> Any:
        import cloudpickle

        return cloudpickle.loads(self.payload)

    def _exception(self) -> BaseException:
        remote = str(self.header.get("traceback", ""))
        kind, message = str(self.header.get("type", "")), str(self.header.get("message", ""))
        try:
            error = self._loads() if self.payload else None
        except Exception as exc:  # its class is not importable here, or will not rebuild
            error = RemoteError(kind, f"{message} (not rebuilt here: {type(exc).__name__}: {exc})", remote)
        if not isinstance(error, BaseException):
            error = RemoteError(kind, message, remote)
        error.add_note(f"raised on the fleet:\n{remote.rstrip()}")
        return error


class Outcomes:
    """The outcome of a map's task of several calls (``chunksize``): each call's :class:`Outcome` in
    turn, as many as ended (fewer than the task holds when it was killed midway)."""

    def __init__(self, data: bytes) -> None:
        self.header, entries = read_outcomes(data)
        self.first, self.count = int(self.header["first"]), int(self.header["calls"])
        self.calls = [Outcome(entry) for entry in entries]

    def call(self, number: int, job: Job, function: str) -> Any:
        """The task's call ``number`` (0: its first): its return value, or its exception raised."""
        if number < len(self.calls):
            return self.calls[number].value(job, function)
        raise JobFailed(
            job,
            f"job {job.id} {job.state.value} ({job.reason}) before {function} ended for item "
            f"{self.first + number}: {len(self.calls)} of its {self.count} calls ended (fleet logs {job.id})",
        )

    def value(self, job: Job, function: str) -> list[Any]:
        """Every call's return value, in order; the first exception raised, naming its item."""
        values = []
        for number in range(self.count):
            try:
                values.append(self.call(number, job, function))
            except Exception as exc:
                exc.add_note(
                    f"item {self.first + number}: call {number + 1} of the {self.count} job {job.id} made"
                )
                raise
        return values


def read(data: bytes, job: Job) -> Outcome | Outcomes:
    """An outcome file as the job's runner left it; :class:`FleetError` for one this fleet cannot read
    (a runner of a newer release wrote it)."""
    try:
        return Outcomes(data) if data.startswith(OUTCOMES_MAGIC) else Outcome(data)
    except (KeyError, TypeError, ValueError) as exc:
        kind = data.partition(b"\n")[0][:40].decode(errors="replace")
        raise FleetError(
            f"job {job.id}: its outcome ({kind!r}) cannot be read here ({exc}): the job's runner "
            "(fleet_worker) is of another fleet release than this one; use the same release on both sides"
        ) from None


def _fix(exc: Exception) -> str:
    """What to do about a return value this process cannot rebuild."""
    if "CUDA" in str(exc):  # torch's words for a tensor on a GPU, read where there is none
        return "it holds a tensor on a GPU, and this process has none: return it on the CPU (t.cpu())"
    return "a class it holds must be importable in this process (run from the directory its module is in)"


class FunctionHandle(JobHandle, Generic[R]):
    """A submitted call: ``result()`` as a future's, ``done()``, and everything a job handle does."""

    def __init__(self, client: Source, job_id: str, function: str) -> None:
        super().__init__(client, job_id)
        self.function = function
        self._outcome: tuple[int, Outcome | Outcomes | None] | None = None  # (attempt, outcome) once final

    @property
    def job_id(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"FunctionHandle({self.id!r}, {self.function})"

    def __reduce__(self) -> tuple[Any, ...]:
        """As an argument of a call: a placeholder the job's runner replaces with this call's result
        (:func:`fleet_worker.call.result_of`), the job recorded in :data:`PASSED`."""
        passed = PASSED.get()
        if passed is None:
            raise TypeError(
                f"{self!r} is pickled only as an argument of a function's call (g.submit(handle)), "
                "which gets its result; pass handle.result() to pickle the value"
            )
        passed.append(self.id)
        return (result_of, (self.id,))

    def result(self, timeout: float | None = None) -> R:  # type: ignore[override]
        """The function's return value once the job ended; its exception raised again (with the
        node's traceback as a note); :class:`JobCancelled`, :class:`JobFailed` when the job ended
        without one; :class:`fleet.JobTimeout` after ``timeout`` seconds."""
        return self._result_of(self.wait(timeout))

    def _result_of(self, job: Job) -> R:
        """:meth:`result` of the job as it ended (``job``: its final status); of a map's task of
        several calls, their return values in order (the first exception raised)."""
        return cast(R, self._ended(job).value(job, self.function))

    def _call_of(self, job: Job, number: int) -> Any:
        """A map's task's call ``number`` (0: its first) as :meth:`result` gives a single call's."""
        outcome = self._ended(job)
        if isinstance(outcome, Outcomes):
            return outcome.call(number, job, self.function)
        return outcome.value(job, self.function)  # one call, or one that stands for each of the task's

    def _ended(self, job: Job) -> Outcome | Outcomes:
        """The outcome of the job as it ended; :class:`JobCancelled`, :class:`JobFailed` for none."""
        if job.state == JobState.CANCELLED:
            raise JobCancelled(job, f"job {job.id} CANCELLED: {job.reason}{self._unmade(job)}")
        outcome = self._outcome_of(job)
        if outcome is None:
            note = f" ({job.outputs_note})" if job.outputs_note else ""
            if job.state == JobState.FAILED:
                raise JobFailed(job, f"job {job.id} FAILED: {job.reason} (its output: fleet logs {job.id})")
            raise JobFailed(
                job, f"job {job.id} {job.state.value} and left no outcome of {self.function}{note}"
            )
        return outcome

    def _unmade(self, job: Job) -> str:
        """Why a call cancelled for a dependency was not made: the result it takes of that job."""
        inputs = job.spec.call.inputs if job.spec.call is not None else []
        failed = [i for i in inputs if f"dependency {i} " in job.reason]
        if not failed:
            return ""
        return (
            f"; {self.function} was not called: it takes the result of job {failed[0]}, which did not "
            f"succeed (fleet result {failed[0]} says why)"
        )

    def _forget(self) -> None:
        """Let go of the outcome read (a map is done with its task's calls)."""
        self._outcome = None

    def _outcome_of(self, job: Job) -> Outcome | Outcomes | None:
        """The outcome the job's last attempt left, or None (it left none: killed, or lost); read
        once for a job that ended."""
        if self._outcome is not None and self._outcome[0] == job.attempt:
            return self._outcome[1]
        found = self._fetch(job)
        if job.state.final:
            self._outcome = (job.attempt, found)
        return found

    def _fetch(self, job: Job) -> Outcome | Outcomes | None:
        if job.outputs_attempt != job.attempt:
            return None
        with tempfile.TemporaryDirectory(prefix="fleet-outcome-") as folder:
            try:
                files = self.client.download(self.id, FOLDER, folder)
            except NotFound:
                return None
            found = [path for path in files if Path(path).name == OUTCOME]
            return read(Path(found[0]).read_bytes(), job) if found else None
