"""``fleet shell``: a shell, or one command, inside a running job's environment, from anywhere."""

from __future__ import annotations

import os
import signal
import sys
import termios
import threading
import tty as ttys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import TYPE_CHECKING

import click

from fleet.cli.common import CONTEXT, Globals, complete_jobs, pass_globals
from fleet.cli.submit import CommandAfterDashes

if TYPE_CHECKING:
    from fleet.client.shell import ShellSession


@click.command(
    cls=CommandAfterDashes,
    context_settings=CONTEXT,
    short_help="a shell (or -- CMD) inside a running job, from anywhere (srun --pty, det shell)",
    epilog="Examples: fleet shell JOB; fleet shell JOB -- nvidia-smi; printf 'echo hi\\n' | fleet shell "
    "JOB -- sh; fleet shell JOB --rank 1. It runs on the job's node (a multi-node job's member "
    "--rank, default 0) as the job does: Docker runtime, "
    "in the job's container; process runtime, as the job's user, in its working directory, "
    "environment and cgroup (what you start counts against the job's limits and ends with it). It "
    "ends when the command exits, the job ends, or after an hour with no input nor output.",
)
@click.argument("job", metavar="JOB [-- COMMAND [ARGS]...]", shell_complete=complete_jobs)
@click.option(
    "--rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="a multi-node job's member to enter (`fleet show JOB` lists them)",
)
@pass_globals
@click.pass_context
def shell(ctx: click.Context, globals_: Globals, /, job: str, rank: int) -> int:
    """A shell, or the command after `--`, inside the running job JOB: as the job's user, in its
    working directory, with its environment, as `srun --pty` or `det shell` give. Exits with the
    command's exit code.

    On a terminal it gets a terminal of its own (your keys go to it as typed: Ctrl-C interrupts
    the command there, not fleet shell); otherwise (a script, a pipe) its stdin is your stdin, its
    stdout and stderr yours. You may enter the jobs you may see with `fleet show`."""
    from fleet.client.shell import open_shell

    command = ctx.meta.get("fleet.command", [])
    on_tty = sys.stdin.isatty() and sys.stdout.isatty()
    session = open_shell(
        job,
        command,
        tty=on_tty,
        term=os.environ.get("TERM", "") if on_tty else "",
        size=_size() if on_tty else None,
        url=globals_.api_url,
        rank=rank,
    )
    try:
        with _raw(on_tty):
            if on_tty:
                _on_resize(lambda: session.resize(*_size()))
            threading.Thread(target=_pump_input, args=(session, on_tty), daemon=True).start()
            for kind, data in session.output():
                out = sys.stderr if kind == "e" else sys.stdout
                out.buffer.write(data)
                out.buffer.flush()
    finally:
        session.close()
    return session.exit_code or 0


def _pump_input(session: ShellSession, on_tty: bool) -> None:
    """Standard input to the session as it comes (a terminal's keys one by one); EOF once it ends."""
    from websockets.exceptions import ConnectionClosed

    try:
        while data := os.read(0, 65536):
            session.send(data)
        if not on_tty:
            session.eof()
    except (ConnectionClosed, OSError):  # the command ended: its exit code says the rest
        pass


@contextmanager
def _raw(on_tty: bool) -> Iterator[None]:
    """The terminal in raw mode (every key to the remote command) for the block, restored after."""
    if not on_tty:
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        ttys.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _on_resize(tell: Callable[[], None]) -> None:
    def handler(_sig: int, _frame: FrameType | None) -> None:
        with suppress(Exception):
            tell()

    signal.signal(signal.SIGWINCH, handler)


def _size() -> tuple[int, int]:
    """(rows, columns) of the terminal on stdout, as the kernel has it (not $LINES/$COLUMNS, which a
    parent may have set for a terminal of another size)."""
    size = os.get_terminal_size(sys.stdout.fileno())
    return size.lines, size.columns
