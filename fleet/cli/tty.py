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

from fleet.cli.view import Bar, Field, Table, View

#: the colour of a state (a job's, a node's, a GPU's) wherever one is shown
STYLES = {
    "QUEUED": "yellow",
    "SCHEDULED": "cyan",
    "STARTING": "cyan",
    "RUNNING": "green",
    "SUCCEEDED": "bright_green",
    "FAILED": "red",
    "CANCELLED": "magenta",
    "READY": "green",
    "CORDONED": "yellow",
    "DRAINING": "yellow",
    "DRAINED": "blue",
    "DOWN": "red",
    "free": "green",
    "claimed": "cyan",
    "busy:": "yellow",
    "not": "yellow",
}
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
    word = value.split(" ", 1)[0].split("=", 1)[0]  # an array's QUEUED=9990: its first state
    return STYLES.get(word, STYLES.get(word.rstrip(":"), "red" if word else ""))


def print_view(view: View) -> None:
    console().print(render(view))


def render(view: View) -> RenderableType:
    return Group(*(_part(p, view.label_width) for p in view.parts))


def _part(part: Table | Field | Bar | str, label_width: int) -> RenderableType:
    if isinstance(part, Table):
        return _table(part)
    if isinstance(part, Field):
        value_style = style_of(part.value) if part.state else ""
        return Text.assemble((f"{part.label + ':':<{label_width}}", "bold"), (part.value, value_style))
    if isinstance(part, Bar):
        grid = RichTable.grid(padding=(0, 1))
        meter = ProgressBar(total=1.0, completed=part.fraction, width=30)
        grid.add_row(Text(f"{part.label + ':':<{label_width - 1}}", style="bold"), meter, Text(part.text))
        return grid
    return Text(part)


def _table(part: Table) -> RenderableType:
    """Every row one line, fitted to the terminal: see :func:`fit`."""
    shown, widths = fit(part, console().width)
    out = RichTable(box=None, header_style="bold", padding=(0, 1, 0, 0), pad_edge=False)
    states = {i for i in shown if part.headers[i] in STATE_COLUMNS}
    for i in shown:
        # what still does not fit, rich narrows: any column but the first (the id) and states
        keep = i == 0 or i in states
        out.add_column(part.headers[i], no_wrap=keep, overflow="ellipsis", width=widths.get(i))
    for row in part.rows:
        out.add_row(*(_cell(row[i], i in states) for i in shown))
    if part.title is None:
        return out
    return Group(Text(""), Text(f"{part.title}:", style="bold"), out)


#: the narrowest a free-text column is cut to before columns are left out
MIN_WIDE = 12


def fit(part: Table, width: int) -> tuple[list[int], dict[int, int]]:
    """The columns to show, and a width for the one cut short. Too wide for the terminal: the
    ``wide`` column (free text) is cut short (…) down to MIN_WIDE, then the ``optional`` columns
    are left out, in their order."""
    natural = [max([len(str(h)), *(len(_text(r[i])) for r in part.rows)]) for i, h in enumerate(part.headers)]
    shown = list(range(len(part.headers)))

    def excess() -> int:
        return sum(natural[i] for i in shown) + len(shown) - 1 + part.indent - width

    widths: dict[int, int] = {}
    wide = part.wide
    if wide is not None and excess() > 0:
        natural[wide] = widths[wide] = max(MIN_WIDE, natural[wide] - excess())
    for i in part.optional:
        if excess() <= 0:
            break
        shown.remove(i)
    return shown, widths


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _cell(value: Any, state: bool) -> Text:
    text = _text(value)
    return Text(text, style=style_of(text) if state else "", no_wrap=True, overflow="ellipsis")


def live(frame: Callable[[], View], interval: float, screen: bool) -> None:
    """Redraw ``frame()`` in place every ``interval`` seconds until Ctrl-C (KeyboardInterrupt)."""

    def drawn() -> RenderableType:
        now = time.strftime("%H:%M:%S")
        return Group(Text(f"every {interval:g}s, {now}; Ctrl-C stops", style="dim"), render(frame()))

    with Live(drawn(), console=console(), auto_refresh=False, screen=screen) as shown:
        while True:
            time.sleep(interval)
            shown.update(drawn(), refresh=True)
