"""What a CLI command shows, as plain data: tables, fields, bars and lines of text.

:mod:`fleet.cli.output` prints a view as plain text (or JSON), :mod:`fleet.cli.tty` through rich.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


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
