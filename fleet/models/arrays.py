"""Job arrays: the index sets a sweep runs over (``0-9999``, ``1,3,5-9``), parsed and normalised.

An array is one submit of many tasks; task ``i`` of array ``A`` is the job ``A-i``. Indices are
kept sorted and without duplicates; their normal form (runs of consecutive indices written as
``a-b``) is what the array record stores, so a 10,000-task sweep stores ``0-9999``, not 10,000
numbers. ``TasksChanged`` counts what a hold or release of every queued task of an array did.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from pydantic import BaseModel

from fleet.models.base import _LAZY

#: most tasks one array may hold: each costs ~0.5 KB of Redis while queued, and the controller
#: reads every queued task on each pass
ARRAY_TASKS_MAX = 100_000
#: largest index (7 digits keep task ids short)
ARRAY_INDEX_MAX = 9_999_999
#: tasks created by one script call: a larger array is created in several, pipelined, so Redis
#: serves other clients between them (each call is atomic; a retry completes a partial array)
ARRAY_BATCH = 10_000
#: labels every task carries, linking it to its array (``fleet.`` label keys are fleet's own)
ARRAY_LABEL = "fleet.array"
INDEX_LABEL = "fleet.array.index"

_ITEM = re.compile(r"^\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?\Z")


def parse_indices(text: str) -> tuple[int, ...]:
    """Sorted indices from ``0-9999`` or ``1,3,5-9``; ValueError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected indices like 0-99 or 1,3,5-9")
    indices: list[int] = []
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise ValueError(f"{item.strip()!r} is not an index or a range A-B (e.g. 0-99 or 1,3,5-9)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"range {first}-{last} runs backwards; write {last}-{first}")
        _check_bounds(first, last, len(indices))
        indices.extend(range(first, last + 1))
    return check_indices(indices)


def check_indices(indices: Iterable[int]) -> tuple[int, ...]:
    """``indices`` sorted; ValueError if empty, too many, out of range, not ints, or repeated."""
    values = list(indices)
    if not values:
        raise ValueError("an array needs at least one index")
    if len(values) > ARRAY_TASKS_MAX:
        raise ValueError(f"{len(values)} tasks; an array holds at most {ARRAY_TASKS_MAX}")
    if not all(type(i) is int for i in values):
        raise ValueError("indices must be integers")
    ordered = sorted(values)
    _check_bounds(ordered[0], ordered[-1], 0)
    for before, after in itertools.pairwise(ordered):
        if before == after:
            raise ValueError(f"index {after} appears twice")
    return tuple(ordered)


def _check_bounds(first: int, last: int, so_far: int) -> None:
    if first < 0 or last > ARRAY_INDEX_MAX:
        raise ValueError(f"indices run from 0 to {ARRAY_INDEX_MAX}")
    if so_far + last - first + 1 > ARRAY_TASKS_MAX:
        raise ValueError(f"more than {ARRAY_TASKS_MAX} tasks; an array holds at most {ARRAY_TASKS_MAX}")


def normal_form(indices: tuple[int, ...]) -> str:
    """Sorted, distinct ``indices`` as ``a-b`` runs joined by commas: ``(1, 3, 5, 6, 7)`` -> ``1,3,5-7``."""
    runs: list[str] = []
    start = prev = indices[0]
    for i in (*indices[1:], None):
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(runs)


def task_id(array_id: str, index: int) -> str:
    return f"{array_id}-{index}"


def task_ids(array_id: str, indices: str) -> list[str]:
    """Every task id of the array whose normal-form indices are ``indices``."""
    return [task_id(array_id, i) for i in parse_indices(indices)]


class TasksChanged(BaseModel):
    """What ``fleet hold ARRAY`` or ``fleet release ARRAY`` did: how many queued tasks it held (or
    released), how many were so already, and how many were not queued (on nodes or ended)."""

    model_config = _LAZY

    changed: int = 0
    already: int = 0
    not_queued: int = 0
