"""Views on a terminal, through rich: colour, tables fitted to the width, live redraws.

Imported only when standard output is a terminal (rich costs ~40 ms to import: more than a
script's ``fleet jobs`` may spend on it). rich honours ``NO_COLOR`` (no colour) and ``COLUMNS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table as RichTable
from rich.text import Text

from fleet.cli.output import Bar, Field, Table, View

#: the colour of a state (a job's, a node's, a GPU's) wherever one is shown
STYLES = {
    "QUEUED": "yellow", "SCHEDULED": "cyan", "STARTING": "cyan", "RUNNING": "green",
    "SUCCEEDED": "bright_green", "FAILED": "red", "CANCELLED": "magenta",
    "READY": "green", "CORDONED": "yellow", "DRAINING": "yellow", "DRAINED": "blue", "DOWN": "red",
    "free": "green", "claimed": "cyan", "busy:": "yellow", "not": "yellow",
}  # fmt: skip
#: columns whose cells are states, coloured by their first word
STATE_COLUMNS = {"STATE", "STATUS"}

_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        _console = Console(highlight=False, soft_wrap=False)
    return _console


def style_of(value: str) -> str:
    """A state's colour; anything not a known state (``lost``, ``unhealthy``) reads as trouble."""
    word = value.split(" ", 1)[0]
    return STYLES.get(word, STYLES.get(word.rstrip(":"), "red" if word else ""))


def print_view(view: View) -> None:
    console().print(render(view))


def render(view: View) -> RenderableType:
    return Group(*(_part(p) for p in view.parts))


def _part(part: Table | Field | Bar | str) -> RenderableType:
    if isinstance(part, Table):
        return _table(part)
    if isinstance(part, Field):
        label = Text(f"{part.label + ':':<12}", style="bold")
        return label + Text(part.value, style=style_of(part.value) if part.state else "")
    if isinstance(part, Bar):
        grid = RichTable.grid(padding=(0, 1))
        grid.add_row(Text(f"{part.label + ':':<11}", style="bold"), ProgressBar(total=1.0,
                     completed=part.fraction, width=30), Text(part.text))  # fmt: skip
        return grid
    return Text(part)


def _table(part: Table) -> RichTable:
    """Every row one line: on a narrow terminal the ``wide`` column is cut short (…) first."""
    out = RichTable(
        title=f"{part.title}" if part.title else None, title_justify="left", title_style="bold",
        box=None, header_style="bold", padding=(0, 2, 0, 0), pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    for i, header in enumerate(part.headers):
        out.add_column(header, no_wrap=i != part.wide, overflow="ellipsis")
    states = {i for i, h in enumerate(part.headers) if h in STATE_COLUMNS}
    for row in part.rows:
        out.add_row(*(_cell(v, i in states) for i, v in enumerate(row)))
    return out


def _cell(value: Any, state: bool) -> Text:
    text = "" if value is None else str(value)
    return Text(text, style=style_of(text) if state else "", no_wrap=True, overflow="ellipsis")


def live(frame: Callable[[], View], interval: float, screen: bool) -> None:
    """Redraw ``frame()`` in place every ``interval`` seconds until Ctrl-C (KeyboardInterrupt)."""
    with Live(render(frame()), console=console(), auto_refresh=False, screen=screen) as shown:
        while True:
            time.sleep(interval)
            shown.update(render(frame()), refresh=True)
