"""Arguments of the Python API, checked before any call: a mistake is a :class:`SpecError` naming
the argument and the fix, raised where the caller made it, never a ``TypeError`` from deep inside
or an HTTP 400 about a query parameter the caller never wrote."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleet.errors import SpecError


def ident(value: object, what: str = "job id") -> str:
    """A job, array, node or token id: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(
            f"{what} {value!r}: expected a non-empty string (e.g. handle.id or a name from listings)"
        )
    return value


def seconds(value: object, what: str = "timeout") -> float | None:
    """A timeout in seconds: None (no limit) or a number >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        raise SpecError(f"{what} {value!r}: expected seconds as a number >= 0, or None for no limit")
    return float(value)


def count(value: object, what: str, least: int = 1, most: int = 100_000) -> int:
    """A whole number within bounds (a listing's limit, a rank)."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise SpecError(f"{what} {value!r}: expected a whole number from {least} to {most}")
    return value


def chunksize(value: object) -> int:
    """``chunksize``: calls one task (or job) makes, one after another; 1, a task per call."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise SpecError(
            f"chunksize {value!r}: expected a whole number of calls per task from 1 to 100000 "
            "(1: a task per call; e.g. chunksize=25 makes 40 tasks of a map of 1,000 items)"
        )
    return value


def attempt(value: object) -> int | None:
    """An attempt number (1 is the first), or None for the latest."""
    return None if value is None else count(value, "attempt", 1, 1_000_000)


def labels(value: object, what: str = "labels") -> dict[str, str] | None:
    """Labels to match: a dict of str to str (``{"exp": "7"}``), or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(f"{what} {value!r}: expected a dict of strings, e.g. {{'exp': '7'}}")
    bad = [k for k in value if not k or "=" in k]
    if bad:
        raise SpecError(f"{what}: key {bad[0]!r} must be non-empty and hold no '='")
    return dict(value)


def names(value: object, what: str = "nodes") -> list[str]:
    """Node names: one name or a list of them (a bare string is one name, not its letters)."""
    found = [value] if isinstance(value, str) else list(value) if isinstance(value, Iterable) else None
    if not found or not all(isinstance(n, str) and n for n in found):
        raise SpecError(f"{what} {value!r}: expected a node name or a list of node names")
    return found


def indices(value: object) -> str | list[int]:
    """A job array's indices: ``"0-9999"``, ``"1,3,5-9"`` or whole numbers."""
    if isinstance(value, str):
        return value
    found = list(value) if isinstance(value, Iterable) else None
    if found is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in found):
        raise SpecError(f"indices {value!r}: expected a range like '0-9999' or '1,3,5-9', or whole numbers")
    return found


def spec(value: Any) -> Any:
    """A job spec: a :class:`fleet.JobSpec` or a dict of its fields."""
    from fleet.models import JobSpec

    if not isinstance(value, JobSpec | Mapping):
        raise SpecError(
            f"spec {value!r}: expected a JobSpec(name=..., command=[...]) or a dict of its fields"
        )
    return value


def after(value: Iterable[object] | None) -> list[object]:
    """``after=``: handles, job ids (``"JOB"``, ``"JOB:any"``) or ``{job, when}`` as the spec takes them."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Iterable):
        value = [value]  # one dependency given alone
    items = [getattr(v, "id", v) for v in value]
    for item in items:
        if not isinstance(item, str | Mapping):
            raise SpecError(f"after: {item!r} is not a job: give handles, job ids or 'JOB:ok|any|notok'")
    return items
