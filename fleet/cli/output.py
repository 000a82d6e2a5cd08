"""Rendering for the CLI: aligned tables for people, ``-o json`` for scripts.

A command builds a :class:`View` (tables and lines of text, plain data) and :func:`show_view` prints it:
on a terminal through rich (colour, fitted to its width: :mod:`fleet.cli.tty`, imported only then),
else as plain aligned text that stays the same from one release to the next, for scripts that read
it. :func:`present` shows a view once, or redraws it every few seconds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from fleet.models import Tenant

GiB = 1 << 30


def emit_json(data: Any) -> None:
    """JSON for scripts; every ``*_at`` time (unix seconds) gets an ISO 8601 twin, ``*_at_iso``."""
    json.dump(_with_iso(_plain_data(data)), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _plain_data(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [_plain_data(d) for d in data]
    if isinstance(data, dict):
        return {k: _plain_data(v) for k, v in data.items()}
    return data


def _with_iso(data: Any) -> Any:
    if isinstance(data, list):
        return [_with_iso(d) for d in data]
    if not isinstance(data, dict):
        return data
    out = {k: _with_iso(v) for k, v in data.items()}
    for key, value in data.items():
        if (key.endswith("_at") or key == "at") and isinstance(value, int | float) and value > 0:
            out[f"{key}_iso"] = iso(value)
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers], *([("-" if c is None else str(c)) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def ago(at: float | None, now: float | None = None) -> str:
    if not at:
        return "-"
    seconds = (now or time.time()) - at
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def took(seconds: float) -> str:
    """A duration as people write it: ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(at: float | None, now: float | None = None) -> str:
    """A time of day (today), or the date and time (earlier)."""
    if not at:
        return "-"
    same_day = time.localtime(at)[:3] == time.localtime(now or time.time())[:3]
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M", time.localtime(at))


def iso(at: float) -> str:
    """ISO 8601 in UTC, to the millisecond: ``2026-11-22T07:25:04.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"


def stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def size(n: int | None) -> str:
    return "-" if not n else f"{n / GiB:.0f}GiB" if n >= GiB else f"{n >> 20}MiB"


def bar(fraction: float, width: int = 30) -> str:
    """``[#########.....................]``: a bar for plain text."""
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


# -- views ---------------------------------------------------------------------------------------


@dataclass
class Table:
    """Rows under headers. ``title``: a line above it (``NAME:``, after a blank line, in plain
    text); ``indent``: spaces before each plain line. On a terminal narrower than the table, the
    ``wide`` column (a free-text one such as REASON) is cut short first, then the ``optional`` ones
    are left out, in that order (piped, every column is always there)."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]
    title: str | None = None
    indent: int = 0
    wide: int | None = None
    optional: Sequence[int] = ()


@dataclass
class Field:
    """``Label:     value`` (a detail line of ``fleet show``); ``state``: the value is coloured as one."""

    label: str
    value: str
    state: bool = False


@dataclass
class Bar:
    """A progress bar line: ``Progress:   [####......] 45%  step 450 of 1000``."""

    label: str
    fraction: float
    text: str


@dataclass
class View:
    """What a command shows: tables, fields, bars and plain lines, in order."""

    parts: list[Table | Field | Bar | str] = field(default_factory=list)
    #: the width of a Field's ``Label:`` (its value starts after it)
    label_width: int = 12

    def add(self, part: Table | Field | Bar | str) -> View:
        self.parts.append(part)
        return self


def on_terminal() -> bool:
    """People read it (colour, fitted tables), not a script or a file."""
    return sys.stdout.isatty()


def show_view(view: View) -> None:
    """Print a view: through rich on a terminal, else as plain text."""
    if on_terminal():
        from fleet.cli import tty

        tty.print_view(view)
    else:
        print_plain(view)


def print_plain(view: View) -> None:
    for part in view.parts:
        if isinstance(part, Table):
            if part.title is not None:
                print(f"\n{part.title}:")
            pad = " " * part.indent
            headers = [pad + str(part.headers[0]), *part.headers[1:]]
            table(headers, [(pad + _cell(r[0]), *r[1:]) for r in part.rows])
        elif isinstance(part, Field):
            print(f"{part.label + ':':<{view.label_width}}{part.value}".rstrip())
        elif isinstance(part, Bar):
            print(f"{part.label + ':':<{view.label_width}}{bar(part.fraction)} {part.text}")
        else:
            print(part)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def present(frame: Callable[[], Any], interval: float | None, output: str, screen: bool = False) -> int:
    """Show ``frame()`` once, or with ``interval`` every so many seconds until Ctrl-C: redrawn in
    place on a terminal, else a new snapshot each time (a blank line between; ``-o json``: one
    JSON document a line). ``frame`` returns a View, or for ``-o json`` what :func:`emit_json` takes."""
    if interval is None:
        shown = frame()
        if output == "json":
            emit_json(shown)
        else:
            show_view(shown)
        return 0
    try:
        if output != "json" and on_terminal():
            from fleet.cli import tty

            tty.live(frame, interval, screen)
            return 0
        first = True
        while True:
            shown = frame()
            if output == "json":
                sys.stdout.write(json.dumps(_with_iso(_plain_data(shown)), default=str) + "\n")
            else:
                print("" if first else "\n", end="")
                print_plain(shown)
            sys.stdout.flush()
            first = False
            time.sleep(interval)
    except KeyboardInterrupt:  # how a watch is ended: not an error
        return 0


def guarantee(tenant: Tenant) -> str:
    """'8 GPUs', or with CPU and memory guarantees '8 GPUs, 64 CPUs, 256GiB'."""
    parts = [f"{tenant.guaranteed_gpus} GPU{'s' if tenant.guaranteed_gpus != 1 else ''}"]
    if tenant.guaranteed_cpus:
        parts.append(f"{tenant.guaranteed_cpus:g} CPUs")
    if tenant.guaranteed_memory:
        parts.append(size(tenant.guaranteed_memory))
    return ", ".join(parts)
