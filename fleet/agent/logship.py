"""Ship the output of every attempt on the node to its capped Redis stream, from one thread.

Each round reads what every followed attempt wrote since its cursor (``Runtime.read_logs``, which
never waits) and appends all of it to Redis in one pipeline. Rounds run every ``interval_s`` while
some attempt is followed, and not at all otherwise. An attempt that ended gets its last read in the
next round, woken at once, which ships its last line, newline or not (:meth:`LogShipper.finish`):
the agent calls it before it records the end and removes the attempt with its output.

While Redis is unreachable a round holds its batch and retries with backoff; cursors move only once
a batch is stored, and a restarted agent resumes from the last cursor stored, so a Redis or agent
restart loses no line and ships none twice. The runtime keeps the output meanwhile (the attempt's
file, Docker's log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fleet.agent.runtime.base import Runtime
from fleet.errors import FleetError
from fleet.log import StepHealth, event
from fleet.models import Progress
from fleet.progress import last_report
from fleet.state.jobs import JobStore

log = logging.getLogger("fleet.agent.logs")


def clip(line: str, limit: int) -> str:
    """``line`` if it holds at most ``limit`` bytes (UTF-8), else its first ``limit`` bytes and how
    many were cut."""
    data = line.encode(errors="replace")
    if len(data) <= limit:
        return line
    return (
        data[:limit].decode(errors="ignore") + f" … [{len(data) - limit} more bytes cut: log_max_line_bytes]"
    )


T = TypeVar("T")
Key = tuple[str, int]


@dataclass
class _Attempt:
    cursor: str | None = None
    #: the cursor was read from Redis (None until the first round that follows the attempt)
    loaded: bool = False
    #: the attempt ended: the next round reads to its end, then stops following it
    ending: bool = False
    #: its last read raised (logged once, until a read works again)
    failing: bool = False
    #: the rank of this node's member of a multi-node job (its own stream); 0 otherwise
    rank: int = 0
    #: lines and bytes shipped by this agent: their average sizes the stream's cap in lines
    lines: int = 0
    size: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class LogShipper(threading.Thread):
    def __init__(
        self,
        runtime: Runtime,
        jobs: JobStore,
        max_lines: int,
        interval_s: float,
        stop: threading.Event,
        *,
        max_line_bytes: int = 16 << 10,
        max_bytes: int = 16 << 20,
    ) -> None:
        super().__init__(name="log-shipper", daemon=True)
        self.runtime, self.jobs, self.stop = runtime, jobs, stop
        self.max_lines, self.interval_s = max_lines, interval_s
        self.max_line_bytes, self.max_bytes = max_line_bytes, max_bytes
        self._attempts: dict[Key, _Attempt] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._health = StepHealth(log)

    def follow(self, job_id: str, attempt: int, rank: int = 0) -> None:
        with self._lock:
            idle = not self._attempts
            self._attempts.setdefault((job_id, attempt), _Attempt(rank=rank))
        if idle:
            self._wake.set()

    def finish(self, job_id: str, attempt: int, timeout: float, rank: int = 0) -> bool:
        """Ship what the ended attempt wrote up to its end and stop following it (followed or not:
        one that ended while no agent ran is shipped from its last stored cursor). False: not done
        within ``timeout`` (Redis unreachable); the next call resumes where shipping got."""
        if not self.is_alive():
            return False
        with self._lock:
            state = self._attempts.setdefault((job_id, attempt), _Attempt(rank=rank))
            state.ending = True
        self._wake.set()
        return state.done.wait(timeout)

    def forget(self, job_id: str, attempt: int) -> None:
        """Stop following an attempt without a last read (a stale one, killed and removed)."""
        with self._lock:
            self._attempts.pop((job_id, attempt), None)

    def following(self) -> set[Key]:
        with self._lock:
            return set(self._attempts)

    def close(self) -> None:
        """End the thread once ``stop`` is set."""
        self._wake.set()
        if self.is_alive():
            self.join(timeout=10)

    def run(self) -> None:
        while not self.stop.is_set():
            self._wake.wait(self.interval_s if self._attempts else None)
            self._wake.clear()  # before the round reads what to ship: a later wake is never lost
            if not self.stop.is_set():
                self._health.guard(self.ship_logs)

    def ship_logs(self) -> None:
        """One round: every followed attempt's new lines, in one pipeline."""
        with self._lock:
            todo = [(key, state, state.ending) for key, state in self._attempts.items()]
        fresh = [(key, state) for key, state, _ in todo if not state.loaded]
        if fresh:
            streams = [(*key, state.rank) for key, state in fresh]
            cursors = self._retrying(lambda: self.jobs.last_log_cursors(streams))
            for (_, state), cursor in zip(fresh, cursors, strict=True):
                state.cursor, state.loaded = cursor, True
        batches = {key: lines for key, state, ending in todo if (lines := self._read(key, state, ending))}
        if batches:
            stored = {(*key, state.rank): batches[key] for key, state, _ in todo if key in batches}
            caps = {(*key, state.rank): self._cap(state) for key, state, _ in todo if key in batches}
            reports = self._progress(stored)
            self._retrying(lambda: self.jobs.append_logs_many(stored, self.max_lines, reports, caps))
        for key, state, ending in todo:
            if key in batches:
                state.cursor = batches[key][-1][0]
            if ending:
                with self._lock:
                    if self._attempts.get(key) is state:
                        del self._attempts[key]
                state.done.set()

    def _progress(self, stored: dict[tuple[str, int, int], list[tuple[str, str]]]) -> dict[Key, Progress]:
        """Each attempt's newest ``fleet-progress`` report in this round (rank 0's: the members of a
        multi-node job report the same steps): the job record keeps only the latest, one write per
        attempt per round however often the job prints."""
        now = time.time()
        found = {}
        for (job_id, attempt, rank), lines in stored.items():
            if rank == 0 and (report := last_report([line for _, line in lines], now)) is not None:
                found[job_id, attempt] = report
        return found

    def _read(self, key: Key, state: _Attempt, ending: bool) -> list[tuple[str, str]]:
        try:
            lines = self.runtime.read_logs(*key, state.cursor, ending)
        except Exception as exc:  # a broken runtime read must never stop the other attempts' shipping
            if not state.failing:
                event(log, "log_read_failing", logging.WARNING, job=key[0], attempt=key[1], error=exc)
            state.failing = True
            return []
        if state.failing:
            event(log, "log_read_recovered", job=key[0], attempt=key[1])
            state.failing = False
        lines = [(cursor, clip(line, self.max_line_bytes)) for cursor, line in lines]
        state.lines += len(lines)
        state.size += sum(len(line) for _, line in lines)
        return lines

    def _cap(self, state: _Attempt) -> int:
        """How many lines the attempt's stream keeps: ``max_lines``, fewer where its lines are long
        enough that ``max_lines`` of them would hold more than ``max_bytes``."""
        if not state.size:
            return self.max_lines
        average = max(state.size / state.lines, 1.0)
        return max(min(self.max_lines, int(self.max_bytes / average)), 1)

    def _retrying(self, call: Callable[[], T]) -> T:
        delay = 0.1
        while True:
            try:
                return call()
            except FleetError as exc:
                if not exc.retryable or self.stop.wait(delay):
                    raise
                delay = min(delay * 2, 2.0)
