"""Forwarded stdin on the agent: a job's input (``spec.stdin``, :mod:`fleet.state.stdin`) written into
the named pipe its attempt reads as stdin (the process runtime's supervisor made it; a Docker
attempt's is in its folder, mounted into its container). The node supervisor holds a writing end of
each, so the job reads no EOF while no agent writes.

One thread per attempt, from its launch (or from a restarted agent's reattach): it writes each entry
into the pipe, then deletes it from the stream, so an agent restarted mid-way goes on where its
predecessor stopped (an entry written just before a crash, not yet deleted, is written again). At
the end of input it closes its end and tells the supervisor to close its own: the job reads EOF. It
stops once the attempt ended or the job closed its stdin. Its writes never block: a job that reads
slowly, or not at all, holds its own thread waiting, which looks every ``BLOCK_MS`` whether the
attempt still runs. A job that ended for good has its input deleted (:meth:`StdinPumps.drop`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from fleet.agent.runtime.base import Piped, Runtime
from fleet.agent.supervision import SupervisorClient
from fleet.log import event
from fleet.models import Job
from fleet.state.stdin import StdinStreams

log = logging.getLogger("fleet.agent.stdin")
#: how long one read of the stream blocks (the thread then checks that the attempt still runs)
BLOCK_MS = 1000
#: how long to wait after a failed read before the next
RETRY_S = 2.0
#: how long to wait for a job that has not opened its stdin yet (a container starting), at most
OPEN_S = 1.0


class StdinPumps:
    """The node's attempts that read forwarded input, each fed by a thread of its own."""

    def __init__(
        self,
        runtime: Runtime,
        supervisor: SupervisorClient,
        stop: threading.Event,
        streams: Callable[[], StdinStreams],
    ) -> None:
        self.runtime, self.supervisor, self.stop = runtime, supervisor, stop
        self._streams_of = streams
        self._live: set[str] = set()
        self._lock = threading.Lock()

    @functools.cached_property
    def streams(self) -> StdinStreams:
        return self._streams_of()  # its connections only once a job asks for stdin

    def follow(self, job: Job, attempt: int, rank: int) -> None:
        """Feed the attempt's stdin, unless it reads none or is fed already."""
        if not job.spec.stdin or rank or not isinstance(self.runtime, Piped):
            return
        key = f"{job.id}.{attempt}"
        with self._lock:
            if key in self._live:
                return
            self._live.add(key)
        threading.Thread(
            target=self._pump, args=(self.runtime, job.id, attempt), name=f"stdin-{key}", daemon=True
        ).start()

    def drop(self, job: Job) -> None:
        """The job ended for good: its input left unread goes."""
        if not job.spec.stdin:
            return
        try:
            self.streams.drop(job.id)
        except Exception as exc:  # it expires on its own
            event(log, "stdin_kept", logging.WARNING, job=job.id, error=exc)

    def _pump(self, runtime: Piped, job_id: str, attempt: int) -> None:
        key = f"{job_id}.{attempt}"
        fd = -1
        try:
            fd = self._open(runtime, job_id, attempt)
            if fd >= 0 and self._feed(runtime, job_id, attempt, fd):
                os.close(fd)
                fd = -1
                self.supervisor.stdin_end(key)
                event(log, "stdin_ended", job=job_id, attempt=attempt)
        except OSError as exc:
            if exc.errno not in (errno.ENXIO, errno.ENOENT, errno.EPIPE):  # the job is gone, or its stdin
                event(log, "stdin_failed", logging.WARNING, job=job_id, attempt=attempt, error=exc)
        except Exception as exc:
            event(log, "stdin_failed", logging.WARNING, job=job_id, attempt=attempt, error=exc)
        finally:
            if fd >= 0:
                os.close(fd)
            with self._lock:
                self._live.discard(key)

    def _feed(self, runtime: Piped, job_id: str, attempt: int, fd: int) -> bool:
        """Write the job's input into ``fd`` as it comes; True at its end, False when the attempt
        ended first (or the agent stops)."""
        cursor = b"0"  # past the last entry written: a deletion that failed writes nothing twice
        while not self.stop.is_set():
            try:
                entries = self.streams.read(job_id, cursor, BLOCK_MS)
            except RedisError as exc:  # Redis away for a while: the input waits there
                event(log, "stdin_unreadable", logging.WARNING, job=job_id, attempt=attempt, error=exc)
                self.stop.wait(RETRY_S)
                entries = []
            for entry_id, fields in entries:
                if b"eof" in fields:
                    return True
                if not _write(fd, fields.get(b"d", b""), lambda: _running(runtime, job_id, attempt)):
                    return False
                cursor = entry_id
                with contextlib.suppress(RedisError):  # kept: a later attempt may get it again
                    self.streams.given(job_id, entry_id)
            if not entries and not _running(runtime, job_id, attempt):
                return False
        return False

    def _open(self, runtime: Piped, job_id: str, attempt: int) -> int:
        """A writing end of the attempt's pipe, once the job has it open (a container opens it as it
        starts); -1 when the attempt ended first, or the agent stops."""
        # non-blocking: with no reader the open fails instead of waiting
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
        wait = 0.05
        while not self.stop.is_set():
            try:
                return os.open(runtime.stdin_pipe(job_id, attempt), flags)
            except OSError as exc:
                if exc.errno != errno.ENXIO or not _running(runtime, job_id, attempt):
                    raise
            self.stop.wait(wait)
            wait = min(wait * 2, OPEN_S)
        return -1


def _write(fd: int, data: bytes, running: Callable[[], bool]) -> bool:
    """Write all of ``data`` into the non-blocking pipe ``fd``, waiting for room while the job runs;
    False when it ended first."""
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:  # the pipe is full: the job reads slower than its input comes
            if not poll.poll(BLOCK_MS) and not running():
                return False
    return True


def _running(runtime: Piped, job_id: str, attempt: int) -> bool:
    with contextlib.suppress(OSError):
        return runtime.running(job_id, attempt)
    return False
