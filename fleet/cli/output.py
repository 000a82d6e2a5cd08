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
from typing import Any

from pydantic import BaseModel

from fleet.cli.view import Bar, Field, Table, View
from fleet.text import bar, iso


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
