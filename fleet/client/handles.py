"""Handles on submitted work, as ``concurrent.futures`` has futures: :class:`JobHandle` (``done()``,
``result()``, ``cancel()``, logs), :func:`wait` and :func:`as_completed` over many, and
:class:`ArrayHandle` for a job array. A handle holds only an id and the client that made it: any
object with the calls of :class:`Source` (:class:`fleet.Client`), so this module imports no client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, Protocol, overload

from fleet.client import checks
from fleet.errors import JobCancelled, JobFailed, JobTimeout, SpecError
from fleet.models import FINAL_STATES, CancelReport, Event, Job, JobArray, JobState, LogLine, Progress
from fleet.models.arrays import task_id


class Source(Protocol):
    """What a handle asks of the client that made it."""

    def get(self, job_id: str) -> Job: ...
    def wait(self, job_id: str, timeout: float | None = None) -> Job: ...
    def logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> list[LogLine]: ...
    def follow_logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> Iterator[LogLine]: ...
    def history(self, job_id: str) -> list[Event]: ...
    def download(
        self,
        job_id: str,
        path: str | None = None,
        dest: str | Path | None = None,
        *,
        checkpoint: str | None = None,
        force: bool = False,
    ) -> list[Path]: ...
    def cancel(self, job_id: str) -> Job: ...
    def array(self, array_id: str) -> JobArray: ...
    def cancel_array(self, array_id: str) -> CancelReport: ...


class JobHandle:
    """A submitted job: wait for it, read its logs, cancel it."""

    def __init__(self, client: Source, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> Job:
        return self.client.get(self.id)

    def wait(self, timeout: float | None = None) -> Job:
        return self.client.wait(self.id, timeout)

    @overload
    def logs(self, attempt: int | None = None, rank: int = 0, *, follow: Literal[False] = False) -> str: ...
    @overload
    def logs(self, attempt: int | None = None, rank: int = 0, *, follow: Literal[True]) -> Iterator[str]: ...

    def logs(self, attempt: int | None = None, rank: int = 0, *, follow: bool = False) -> str | Iterator[str]:
        """The attempt's output so far (default: the latest attempt) as one string; with
        ``follow=True`` an iterator of its lines as they are written, until the attempt is over."""
        if follow:
            return self.follow_logs(attempt, rank)
        return "\n".join(line.line for line in self.client.logs(self.id, attempt, rank))

    def follow_logs(self, attempt: int | None = None, rank: int = 0) -> Iterator[str]:
        """Each line as it is written, until the attempt is over."""
        return (line.line for line in self.client.follow_logs(self.id, attempt, rank))

    def download(
        self,
        path: str | None = None,
        dest: str | Path | None = None,
        *,
        checkpoint: str | None = None,
        force: bool = False,
    ) -> list[Path]:
        """Fetch its kept outputs (``path``: only what is under it), or with ``checkpoint`` ("latest"
        or a name) one of its checkpoints, into ``dest`` (default ``./<job id>``); the files written.
        An existing file is replaced only with ``force``."""
        return self.client.download(self.id, path, dest, checkpoint=checkpoint, force=force)

    def done(self) -> bool:
        """Whether the job is final (SUCCEEDED, FAILED or CANCELLED)."""
        return self.status().state.final

    def result(self, timeout: float | None = None) -> Job:
        """The final status once SUCCEEDED; :class:`JobFailed` or :class:`JobCancelled` (holding it)
        otherwise, :class:`JobTimeout` after ``timeout`` seconds."""
        job = self.wait(timeout)
        if job.state == JobState.CANCELLED:
            raise JobCancelled(job, f"job {job.id} CANCELLED: {job.reason}")
        if job.state == JobState.FAILED:
            raise JobFailed(job, f"job {job.id} FAILED: {job.reason}")
        return job

    def progress(self) -> Progress | None:
        """The current attempt's last ``fleet_worker.progress`` report, or None."""
        return self.status().progress

    def history(self) -> list[Event]:
        return self.client.history(self.id)

    def cancel(self) -> Job:
        return self.client.cancel(self.id)


FIRST_COMPLETED, ALL_COMPLETED = "FIRST_COMPLETED", "ALL_COMPLETED"


def wait(
    handles: Iterable[JobHandle],
    timeout: float | None = None,
    return_when: str = ALL_COMPLETED,
    poll_s: float = 0.5,
) -> tuple[set[JobHandle], set[JobHandle]]:
    """(done, not done), as ``concurrent.futures.wait``: once any job is final (``FIRST_COMPLETED``)
    or all are (``ALL_COMPLETED``), or after ``timeout`` seconds."""
    timeout, poll_s = checks.seconds(timeout), checks.seconds(poll_s, "poll_s") or 0.5
    if return_when not in (FIRST_COMPLETED, ALL_COMPLETED):
        raise SpecError(f"return_when {return_when!r}: expected FIRST_COMPLETED or ALL_COMPLETED")
    pending, finished = set(handles), set[JobHandle]()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        finished |= {h for h in pending if h.done()}
        pending -= finished
        if not pending or (return_when == FIRST_COMPLETED and finished):
            return finished, pending
        if deadline is not None and time.monotonic() >= deadline:
            return finished, pending
        time.sleep(poll_s)


def as_completed(
    handles: Iterable[JobHandle], timeout: float | None = None, poll_s: float = 0.5
) -> Iterator[JobHandle]:
    """Each handle as its job becomes final, as ``concurrent.futures.as_completed``;
    :class:`JobTimeout` if some are not final after ``timeout`` seconds."""
    pending, timeout = set(handles), checks.seconds(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        finished, pending = wait(pending, left, FIRST_COMPLETED, poll_s)
        if not finished:
            raise JobTimeout(f"{len(pending)} jobs not final after {timeout:g}s")
        yield from sorted(finished, key=lambda h: h.id)


class ArrayHandle:
    """A submitted job array: its status, its tasks, wait for all of them, cancel them."""

    def __init__(self, client: Source, array_id: str) -> None:
        self.client = client
        self.id = array_id

    def __repr__(self) -> str:
        return f"ArrayHandle({self.id!r})"

    def status(self) -> JobArray:
        return self.client.array(self.id)

    def task(self, index: int) -> JobHandle:
        return JobHandle(self.client, task_id(self.id, checks.count(index, "index", 0, 10**9)))

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> JobArray:
        """Block until every task is final; raise :class:`JobTimeout` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (array := self.status()).done:
            if deadline is not None and time.monotonic() >= deadline:
                left = array.size - sum(array.tasks.get(s, 0) for s in FINAL_STATES)
                raise JobTimeout(
                    f"job array {self.id}: {left} of {array.size} tasks not final after {timeout:g}s"
                )
            time.sleep(poll_s)
        return array

    def cancel(self) -> CancelReport:
        return self.client.cancel_array(self.id)
