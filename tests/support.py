"""Helpers the tests share (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from bench.procs import FleetProcs

T = TypeVar("T")


def until(check: Callable[[], T | None], why: str = "condition", timeout: float = 30) -> T:
    """What ``check()`` returns once it is truthy; fail after ``timeout`` seconds naming ``why``."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{why} not met within {timeout}s"
        time.sleep(0.05)
    return found


def wait_for(
    condition: Callable[[], object],
    timeout: float = 60,
    what: str = "condition",
    procs: FleetProcs | None = None,
) -> None:
    """Return once ``condition()`` is true; fail after ``timeout`` seconds naming ``what`` (and, given
    the fleet, with its services' logs)."""
    try:
        until(condition, what, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}" + (f"\n{procs.logs()}" if procs else "")) from None
