"""``fleet shell`` sessions on the agent: a command in a running attempt's environment, its bytes
relayed to and from the API through Redis (``fleet.state.shells``).

The API offers a session and sends :class:`ShellOpen`; the agent takes the offer, checks that the
attempt runs here, and starts ``python -m fleet.agent.enter`` (which becomes the job's user in the
job's cgroups, directory and environment, or ``docker exec``s into its container) on a terminal of
its own (the caller has one) or on pipes (a script). A session ends when its command exits, its
caller hangs up, nothing passed either way for ``agent.shell_idle_s``, the attempt ends or the agent
stops (saying which on the session's stderr); at most ``agent.shell_max_sessions`` run at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

from fleet.agent.enter import Entry, carried, entry, stop_marked
from fleet.bus.messages import ShellOpen
from fleet.config import Settings
from fleet.errors import FleetError
from fleet.log import event
from fleet.models import JobState
from fleet.state import JobStore
from fleet.state.shells import ShellRelay

log = logging.getLogger("fleet.agent.shell")
#: how long one read of the session's input blocks (the loop then looks at the command and the job)
BLOCK_MS = 1000
#: how often a session checks that its attempt still runs
CHECK_S = 5.0
#: after a hang-up, how long the command has before it is killed
HANGUP_S = 2.0


class Shells:
    """The node's sessions."""

    def __init__(
        self, settings: Settings, jobs: JobStore, stop: threading.Event, relay: Callable[[], ShellRelay]
    ) -> None:
        self.cfg, self.jobs, self.stop = settings.agent, jobs, stop
        self._relay_of = relay
        self._live: set[str] = set()
        self._lock = threading.Lock()

    @functools.cached_property
    def relay(self) -> ShellRelay:
        return self._relay_of()  # its connections only once a shell is asked for

    def open(self, msg: ShellOpen) -> None:
        """Start the session on a thread of its own (a message handler returns at once)."""
        if not self.relay.take(msg.session):
            event(log, "shell_offer_lapsed", logging.WARNING, job=msg.job_id, session=msg.session)
            return
        with self._lock:
            most = self.cfg.shell_max_sessions
            full = len(self._live) >= most
            if not full:
                self._live.add(msg.session)
        if full:
            self._refuse(
                msg.session,
                FleetError(
                    f"node {self.cfg.node_name} runs {most} shells already, its most "
                    "(agent.shell_max_sessions): try again once one ended"
                ),
            )
            return
        threading.Thread(
            target=self._serve, args=(msg,), name=f"shell-{msg.session[:8]}", daemon=True
        ).start()

    def _serve(self, msg: ShellOpen) -> None:
        try:
            job = self.jobs.get(msg.job_id)
            if job.state != JobState.RUNNING or job.attempt != msg.attempt:
                raise FleetError(f"job {msg.job_id} is {job.state.value}: fleet shell enters a RUNNING job")
            e = entry(self.cfg, msg.job_id, msg.attempt, msg.command, msg.tty, msg.term, msg.session)
            event(
                log,
                "shell_started",
                job=msg.job_id,
                attempt=msg.attempt,
                user=msg.user,
                session=msg.session,
                uid=e.uid,
                command=shlex.join(e.argv),
            )
            code = Session(self.relay, msg, e, lambda: self._alive(msg), self.cfg.shell_idle_s).run()
            event(log, "shell_ended", job=msg.job_id, user=msg.user, session=msg.session, exit_code=code)
        except FleetError as exc:
            self._refuse(msg.session, exc)
        except Exception as exc:
            log.exception("shell session %s failed", msg.session)
            self._refuse(msg.session, FleetError(f"the shell failed on node {self.cfg.node_name}: {exc}"))
        finally:
            with self._lock:
                self._live.discard(msg.session)
            try:
                self.relay.drop(msg.session, "in")
            except Exception as exc:
                event(log, "shell_input_kept", logging.WARNING, session=msg.session, error=exc)

    def _alive(self, msg: ShellOpen) -> bool:
        if self.stop.is_set():
            return False
        job = self.jobs.get(msg.job_id)
        return job.state == JobState.RUNNING and job.attempt == msg.attempt

    def _refuse(self, session: str, exc: FleetError) -> None:
        event(log, "shell_refused", logging.WARNING, session=session, error=exc)
        try:
            self.relay.put(session, "out", {"error": str(exc), "exit_code": exc.exit_code})
        except Exception as err:
            event(log, "shell_refusal_lost", logging.WARNING, session=session, error=err)


class Session:
    """One command and its relay: output pumped out by reader threads, input fed in by ``run``.

    Input is written without waiting (the command's stdin, or its terminal, is non-blocking on the
    agent's side): a command that does not read its stdin leaves the rest pending here (one input
    frame at most; the rest waits in Redis), and the session still sees a hang-up, its idle time
    and the end of its attempt, so it never holds its place (``agent.shell_max_sessions``) or its
    command past them."""

    def __init__(
        self, relay: ShellRelay, msg: ShellOpen, e: Entry, alive: Callable[[], bool], idle_s: float
    ) -> None:
        self.relay, self.msg, self.entry, self.alive, self.idle_s = relay, msg, e, alive, idle_s
        self.last = time.monotonic()
        self.master: int | None = None
        #: where input goes (the terminal's master, or the command's stdin), and what it has not taken
        self.sink = -1
        self.pending = b""
        #: the caller's input ended: the command's stdin is closed once what is pending is through
        self.ended = False

    def run(self) -> int:
        """The command's exit code (128+N: killed by signal N), once it and its output are through."""
        self.relay.put(self.msg.session, "out", {"started": b"1"})
        proc, readers = self._start()
        try:
            self._feed(proc)
        finally:
            if proc.poll() is None:
                _hang_up(proc)
                if self.entry.marker:
                    stopped = stop_marked(self.entry.marker)
                    event(log, "shell_hung_up", session=self.msg.session, processes=stopped)
            for reader in readers:
                reader.join(timeout=5)
            if self.master is not None:
                os.close(self.master)
        code = proc.returncode
        code = 128 - code if code < 0 else code
        self.relay.put(self.msg.session, "out", {"exit": code})
        return code

    def _start(self) -> tuple[subprocess.Popen[bytes], list[threading.Thread]]:
        argv = [sys.executable, "-m", "fleet.agent.enter"]
        env = carried(self.entry)
        if self.msg.tty:
            self.master, slave = os.openpty()
            if self.msg.rows and self.msg.cols:
                _resize(slave, self.msg.rows, self.msg.cols)
            try:
                proc = subprocess.Popen(
                    argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
                )
            finally:
                os.close(slave)
            streams = [(self.master, "o")]
            self.sink = self.master
        else:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            streams = [(proc.stdout.fileno(), "o"), (proc.stderr.fileno(), "e")]
            self.sink = proc.stdin.fileno()
        os.set_blocking(self.sink, False)
        readers = [threading.Thread(target=self._pump, args=s, daemon=True) for s in streams]
        for reader in readers:
            reader.start()
        return proc, readers

    def _pump(self, fd: int, kind: str) -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:  # a terminal's master, non-blocking for the input: wait for output
                select.select([fd], [], [])
                continue
            except OSError:  # EIO: the terminal's last holder closed it
                return
            if not data:
                return
            self.last = time.monotonic()
            self.relay.put(self.msg.session, "out", {kind: data})

    def _feed(self, proc: subprocess.Popen[bytes]) -> None:
        """Input to the command until it exits, its caller hangs up, or the session must end."""
        cursor, checked = b"0", time.monotonic()
        while proc.poll() is None:
            if self._flush(proc):  # all input taken: read more, waiting a while for it
                for eid, fields in self.relay.read(self.msg.session, "in", cursor, block_ms=BLOCK_MS):
                    if b"close" in fields:
                        return
                    cursor = eid
                    self._input(proc, fields)
                    if self.pending:  # the command takes no more for now: the rest waits in Redis
                        break
            else:  # the command does not read what it was sent: look only for a hang-up meanwhile
                if self.relay.hung_up(self.msg.session):
                    return
                select.select([], [self.sink], [], BLOCK_MS / 1000)
            now = time.monotonic()
            if now - self.last > self.idle_s:
                event(log, "shell_idle", session=self.msg.session, idle_s=self.idle_s)
                self._say(f"no input nor output for {self.idle_s:g} s (agent.shell_idle_s): ended")
                return
            if now - checked > CHECK_S:
                checked = now
                if not self.alive():
                    self._say(f"job {self.msg.job_id} attempt {self.msg.attempt} ended: so does this shell")
                    return

    def _say(self, text: str) -> None:
        """A line of fleet's own on the session's stderr (a terminal's: its output)."""
        line = f"fleet shell: {text}\n"
        if self.msg.tty:  # raw mode on the caller's side: a line of its own, carriage returns
            line = "\r\n" + line.replace("\n", "\r\n")
        self.relay.put(self.msg.session, "out", {"o" if self.msg.tty else "e": line.encode()})

    def _input(self, proc: subprocess.Popen[bytes], fields: dict[bytes, bytes]) -> None:
        self.last = time.monotonic()
        if b"resize" in fields and self.master is not None:
            rows, _, cols = fields[b"resize"].partition(b" ")
            _resize(self.master, int(rows), int(cols))
        elif b"d" in fields and not self.ended:
            self.pending += fields[b"d"]
            self._flush(proc)
        elif b"eof" in fields and proc.stdin is not None:
            self.ended = True
            self._flush(proc)

    def _flush(self, proc: subprocess.Popen[bytes]) -> bool:
        """Write what the command takes of the pending input, without waiting; True once all of it is
        through (then, after the caller's EOF, the command's stdin is closed)."""
        while self.pending:
            try:
                self.pending = self.pending[os.write(self.sink, self.pending) :]
            except BlockingIOError:
                return False
            except OSError:  # the command closed its input, or exited: its exit says the rest
                self.pending = b""
        if self.ended and proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
            self.sink = -1
        return True


def _resize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", min(rows, 10_000), min(cols, 10_000), 0, 0))


def _hang_up(proc: subprocess.Popen[bytes]) -> None:
    """SIGHUP to the command's process group, as a closed terminal sends; SIGKILL if it stays."""
    for sig in (signal.SIGHUP, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=HANGUP_S)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
