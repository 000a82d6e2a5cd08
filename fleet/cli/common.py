"""What every command shares: the global options, the client, ``-o``, ``--watch`` and parsing helpers."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleet.errors import FleetError, SpecError

if TYPE_CHECKING:
    from fleet.client import Client

F = TypeVar("F", bound=Callable[..., Any])

#: ``-h`` as well as ``--help``, everywhere; no help text wrapped at click's 80 columns
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@dataclass(frozen=True)
class Globals:
    """``fleet``'s own options (before the command), handed to every command as ``ctx.obj``."""

    config: str | None = None
    api_url: str | None = None
    redis_url: str | None = None

    def client(self) -> Client:
        from fleet.client import Client  # only the commands that talk to the API pay for it

        return Client(self.api_url)


pass_globals = click.make_pass_decorator(Globals, ensure=True)


def output_option(func: F) -> F:
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="table for people, json for scripts (each *_at time with an ISO 8601 *_at_iso twin)",
    )(func)


def watch_option(func: F) -> F:
    """``--watch`` alone: every 2 s; ``--watch 10``: every 10 s."""
    return click.option(
        "-w",
        "--watch",
        type=float,
        callback=_positive,
        is_flag=False,
        flag_value=2.0,
        default=None,
        metavar="[SECONDS]",
        help="redraw every SECONDS (default 2) until Ctrl-C; piped: a new snapshot each time",
    )(func)


def _positive(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise click.BadParameter(f"{value:g}: expected seconds above 0, e.g. --watch 5", ctx, param)
    return value


@contextmanager
def job_goes_on(job_id: str, doing: str = "waiting for", array: bool = False) -> Iterator[None]:
    """Ctrl-C while a command waits for or follows a job ends the command, never the job: say so,
    with how to cancel it, and exit 130 (as a shell does on SIGINT), without a traceback. Done in the
    signal handler itself: a KeyboardInterrupt raised inside a library's callback (pydantic building
    a model on first use) can be swallowed, and the command would go on waiting."""
    what, cancel = ("job array", f"--array {job_id}") if array else ("job", job_id)

    def stop(signum: int, frame: object) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        message = f"fleet: stopped {doing} {what} {job_id}; it goes on (cancel it: fleet cancel {cancel})"
        os.write(2, f"{chr(10) if sys.stderr.isatty() else ''}{message}\n".encode())
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pairs(values: tuple[str, ...] | list[str], flag: str) -> dict[str, str]:
    """``K=V`` values of a repeatable flag, as a dict; a value without ``=`` is a SpecError naming it."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def duration(text: str, flag: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``30min``, ``2h``, ``90d`` (as a job spec's durations)."""
    from fleet.models import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise SpecError(f"{flag}: {exc}") from None
    assert seconds is not None
    return seconds


def _client_for_completion(ctx: click.Context) -> Client:
    """The client of the command line being completed (its --api-url, if typed): no command has run."""
    return Globals(api_url=ctx.find_root().params.get("api_url")).client()


def complete_jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Tab after ``fleet show``: the newest jobs' ids (and job arrays') from the API, or nothing."""
    try:
        found = _client_for_completion(ctx).listing(limit=200)
    except (FleetError, OSError):  # no API, no token: no completions, never an error in the shell
        return []
    return [j.id for j in found if j.id.startswith(incomplete)]


def complete_nodes(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Tab after ``fleet cordon``: the nodes' names from the API, or nothing."""
    try:
        found = _client_for_completion(ctx).nodes()
    except (FleetError, OSError):
        return []
    return [n.name for n in found if n.name.startswith(incomplete)]
