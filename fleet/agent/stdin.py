"""Forwarded stdin on the agent: a job's input (``spec.stdin``, :mod:`fleet.state.stdin`) written into
the named pipe its attempt reads as stdin (process runtime; the supervisor made the pipe).

One thread per attempt, from its launch (or from a restarted agent's reattach): it writes each entry
into the pipe, then deletes it from the stream, so an agent restarted mid-way goes on where its
predecessor stopped (an entry written just before a crash, not yet deleted, is written again). At
the end of input it closes its end and tells the supervisor to close its own: the job reads EOF. It
stops once the attempt ended or the job closed its stdin. A job that ended for good has its input
deleted (:meth:`StdinPumps.drop`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from fleet.agent.runtime.base import Runtime
from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.supervision import SupervisorClient
from fleet.log import event
from fleet.models import Job
from fleet.state.stdin import StdinStreams

log = logging.getLogger("fleet.agent.stdin")
#: how long one read of the stream blocks (the thread then checks that the attempt still runs)
BLOCK_MS = 1000
#: how long to wait after a failed read before the next
RETRY_S = 2.0


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
        if not job.spec.stdin or rank or not isinstance(self.runtime, ProcessRuntime):
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

    def _pump(self, runtime: ProcessRuntime, job_id: str, attempt: int) -> None:
        key = f"{job_id}.{attempt}"
        fd = -1
        try:
            # non-blocking: with no reader (the job ended already) the open fails instead of waiting
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(runtime.stdin_pipe(job_id, attempt), flags)
            os.set_blocking(fd, True)
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
                        os.close(fd)
                        fd = -1
                        self.supervisor.stdin_end(key)
                        event(log, "stdin_ended", job=job_id, attempt=attempt)
                        return
                    _write(fd, fields.get(b"d", b""))
                    cursor = entry_id
                    with contextlib.suppress(RedisError):  # kept: a later attempt may get it again
                        self.streams.given(job_id, entry_id)
                if not entries and not _running(runtime, job_id, attempt):
                    return
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


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _running(runtime: ProcessRuntime, job_id: str, attempt: int) -> bool:
    with contextlib.suppress(OSError):
        status = runtime.status(job_id, attempt)
        return status is not None and status.running
    return False
