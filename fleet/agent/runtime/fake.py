"""Attempts that run in memory: the runtime of tests and simulations, never of a node.

``FakeRuntime`` keeps the :class:`~fleet.agent.runtime.base.Runtime` contract that the process and
Docker runtimes keep (``tests/integration/test_runtime_contract.py`` holds all three to it) without
starting anything: an attempt is a record, and time is whatever ``clock`` says, so a test (or a
benchmark) decides exactly when an attempt ends and how.

What an attempt does comes from its command, read as a tiny shell script (``sh -c "..."`` or the
command itself), one statement after another, each ``;``-separated statement one of:

- ``echo WORDS`` / ``printf WORDS``: a line of output (``printf``'s stays open, without its newline);
- ``sleep N`` (or ``sleep N & wait``): N seconds pass, by ``clock``; ``:`` does nothing;
- ``exit N``, ``true``, ``false``: the attempt ends with N, 0, 1;
- ``sh -c 'SCRIPT'``: a shell in the foreground running SCRIPT, read the same way; ``exec X``: the
  shell becomes X (its trap is gone), and ends with X;
- ``trap '' TERM``: SIGTERM is ignored, by the shell and what it starts (only the SIGKILL after the
  grace ends it); ``trap 'ACTION' TERM``: on SIGTERM, once its foreground command has ended, the
  shell runs ACTION (``echo``, ``sleep``, ending in ``exit N``: a job that checkpoints and exits).

SIGTERM reaches every process of the attempt at once, as the process and Docker runtimes send it
(to the attempt's process group): a foreground ``sleep`` ends on it (143), a foreground shell
reacts as its own trap says, and a shell without a trap ends at once (143).

Anything else runs until the test ends it (:meth:`FakeRuntime.exit`) or it is stopped. A script
that reaches its end exits with its last command's status. Exits are seen by
:meth:`FakeRuntime.poll`, which ``watch``'s thread calls every ``watch_s`` (real time); with
``watch_s`` None there is no thread, and the caller (a test stepping a :class:`ManualClock`) calls
``poll`` itself.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.agent.runtime.base import AttemptStatus, LaunchSpec, exit_reason
from fleet.agent.runtime.script import Script, interpret, term, written
from fleet.errors import LaunchError
from fleet.models import Exit

Key = tuple[str, int]
#: fake pids start here, far above any real pid (``/proc/sys/kernel/pid_max`` is at most 2**22)
_FIRST_PID = 1 << 30
#: how long ``stop`` sleeps between looks while a grace runs
_STEP_S = 0.02


@dataclass
class _Attempt:
    spec: LaunchSpec
    started: float
    pid: int
    script: Script
    exit: Exit | None = None
    #: seconds after its start it ended: kept as the offset, not a clock time, so the lines its
    #: script wrote at that very offset are read back (started + e - started can fall short of e)
    ended_after: float | None = None
    #: (signal name, clock) of every signal it was sent
    signals: list[tuple[str, float]] = field(default_factory=list)
    seen: bool = False
    #: the batch it was last told (``set_batch``; an elastic one's starts at its launch batch)
    batch: int | None = None


class FakeRuntime:
    """In-memory attempts on one node; see the module's docstring for what their commands mean.

    ``clock`` is the time the attempts live by (inject the one the agent and controller use);
    ``sleep`` is how ``stop`` waits out a grace (a manual clock's own ``sleep`` advances it)."""

    name = "fake"

    def __init__(
        self,
        node: str = "fake",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        watch_s: float | None = 0.02,
    ) -> None:
        self.node, self.clock, self.sleep, self.watch_s = node, clock, sleep, watch_s
        self._lock = threading.RLock()
        self._held: dict[Key, _Attempt] = {}
        self._pids = itertools.count(_FIRST_PID)
        self._watchers: list[Callable[[str, int], None]] = []
        #: what ``start`` raises for an image, as a node missing it would (e.g. ``ImageNotFound``)
        self.refuse: dict[str, LaunchError] = {}
        #: every spec started, in order (what ran where, with which environment)
        self.started: list[LaunchSpec] = []

    # -- the Runtime contract ----------------------------------------------------------

    def start(self, spec: LaunchSpec) -> None:
        if spec.image in self.refuse:
            raise self.refuse[spec.image]
        with self._lock:
            if (spec.job_id, spec.attempt) in self._held:
                return
            run = _Attempt(spec, self.clock(), next(self._pids), interpret(spec.command))
            run.batch = spec.batch_size if spec.control else None
            self._held[(spec.job_id, spec.attempt)] = run
            self.started.append(spec)

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM, then SIGKILL once ``grace_s`` passed by ``clock`` (waited in ``sleep`` steps)."""
        self.poll()
        with self._lock:
            run = self._held.get((job_id, attempt))
            if run is None or run.exit is not None:
                return
            run.signals.append(("SIGTERM", self.clock()))
            term(run.script, self.clock() - run.started)
            deadline = self.clock() + grace_s
        self.poll()
        while self.clock() < deadline and self._running(run):
            self.sleep(min(_STEP_S, max(deadline - self.clock(), 0.0)))
            self.poll()
        with self._lock:
            if run.exit is None:
                run.signals.append(("SIGKILL", self.clock()))
                self._end(run, 128 + signal.SIGKILL)
        self.poll()

    def attempts(self) -> list[AttemptStatus]:
        self.poll()
        with self._lock:
            return [AttemptStatus(k[0], k[1], r.exit is None, r.exit) for k, r in sorted(self._held.items())]

    def work_dir(self, job_id: str, attempt: int) -> Path | None:
        return None

    def set_batch(self, job_id: str, attempt: int, batch: int) -> bool:
        with self._lock:
            run = self._held.get((job_id, attempt))
            if run is None or run.batch is None:
                return False
            run.batch = batch
            return True

    def batch_of(self, job_id: str, attempt: int) -> int | None:
        with self._lock:
            run = self._held.get((job_id, attempt))
            return None if run is None else run.batch

    def remove(self, job_id: str, attempt: int) -> None:
        with self._lock:
            run = self._held.get((job_id, attempt))
            if run is not None and run.exit is None:
                run.signals.append(("SIGKILL", self.clock()))
                self._end(run, 128 + signal.SIGKILL)
            self._held.pop((job_id, attempt), None)

    def supervise(self, job_id: str, attempt: int) -> None:
        """Nothing to do: no supervisor fences an attempt that runs nowhere."""

    def pids(self) -> set[int]:
        """A made-up pid per running attempt, far above any real one."""
        self.poll()
        with self._lock:
            return {r.pid for r in self._held.values() if r.exit is None}

    def read_logs(self, job_id: str, attempt: int, cursor: str | None, ended: bool) -> list[tuple[str, str]]:
        """The cursor is the number of lines read; a line without its newline comes once ``ended``.
        It tells no watcher: the log shipper's thread reads, and an exit's watcher waits for that
        thread to ship the attempt's last lines (the real runtimes tell exits from their own watch)."""
        self._catch_up()
        with self._lock:
            run = self._held.get((job_id, attempt))
            if run is None:
                return []
            upto = run.ended_after if run.ended_after is not None else self.clock() - run.started
            lines = [(text, whole) for _, text, whole in written(run.script, upto)]
        found = []
        for index, (text, whole) in enumerate(lines[int(cursor or 0) :], start=int(cursor or 0)):
            if whole or ended:
                found.append((str(index + 1), text))
        return found

    def watch(self, on_exit: Callable[[str, int], None], stop: threading.Event) -> None:
        with self._lock:
            self._watchers.append(on_exit)
        if self.watch_s is None:
            return
        every = self.watch_s

        def loop() -> None:
            while not stop.wait(every):
                self.poll()
            with self._lock:
                self._watchers.remove(on_exit)

        threading.Thread(target=loop, name="fake-runtime-watch", daemon=True).start()

    def close(self) -> None:
        """Nothing to release."""

    # -- what the test (or the simulation) does to attempts ----------------------------

    def poll(self) -> None:
        """End the attempts whose scripts ran to their end by ``clock``, and tell the watchers."""
        self._catch_up()
        ended = []
        with self._lock:
            for run in self._held.values():
                if run.exit is not None and not run.seen:
                    run.seen = True
                    ended.append((run.spec.job_id, run.spec.attempt))
            watchers = list(self._watchers)
        for job_id, attempt in ended:
            for on_exit in watchers:
                on_exit(job_id, attempt)

    def exit(self, job_id: str, attempt: int, code: int = 0, *, oom: bool = False) -> None:
        """End a running attempt now with ``code`` (an OOM kill: ``oom``, as the kernel's is 137)."""
        with self._lock:
            self._end(self._held[(job_id, attempt)], code, oom=oom)
        self.poll()

    def write(self, job_id: str, attempt: int, text: str) -> None:
        """Output written by the attempt now: lines, the last one open unless ``text`` ends a line."""
        with self._lock:
            run = self._held[(job_id, attempt)]
            at, output = self.clock() - run.started, run.script.output
            *lines, rest = text.split("\n")
            output.extend((at, line, True) for line in lines)
            if rest:
                output.append((at, rest, False))
            output.sort(key=lambda line: line[0])

    def signals(self, job_id: str, attempt: int) -> list[str]:
        """The signals sent to an attempt still held, in order."""
        with self._lock:
            return [name for name, _ in self._held[(job_id, attempt)].signals]

    # -- inside ------------------------------------------------------------------------

    def _catch_up(self) -> None:
        """End the attempts whose scripts ran to their end by ``clock``; their watchers hear of it at
        the next ``poll``."""
        now = self.clock()
        with self._lock:
            for run in self._held.values():
                ends_after = run.script.ends_after
                if run.exit is None and ends_after is not None and now - run.started >= ends_after:
                    self._end(run, run.script.code, after=ends_after)

    def _running(self, run: _Attempt) -> bool:
        with self._lock:
            return run.exit is None

    def _end(self, run: _Attempt, code: int, *, oom: bool = False, after: float | None = None) -> None:
        if run.exit is not None:
            return
        reason = "OOMKilled" if oom else exit_reason(code)
        run.exit = Exit(code=code, oom=oom, reason=reason)
        run.ended_after = after if after is not None else self.clock() - run.started


class ManualClock:
    """A clock that moves only when told: one for the controller, the agents and their runtimes.
    Starts at the wall clock's now (stores keep wall-clock times); ``sleep`` moves it on."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(seconds, 0.0))


class FakeSupervisor:
    """The node supervisor's side the agent calls, for attempts that run nowhere: it holds the
    lease it is told, and never fences an attempt."""

    def __init__(self) -> None:
        self.until = 0.0

    def ensure(self) -> None:
        """Always there."""

    def lease(self, until_monotonic: float) -> None:
        self.until = until_monotonic

    def fenced(self, key: str) -> str | None:
        return None

    def forget_fence(self, key: str) -> None:
        """Nothing was fenced."""

    def shutdown(self) -> None:
        """Nothing to stop."""

    def close(self) -> None:
        """Nothing to release."""
