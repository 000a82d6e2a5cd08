"""Helpers the tests share (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.procs import FleetProcs


def wait_for(
    condition: Callable[[], object],
    timeout: float = 60,
    what: str = "condition",
    procs: FleetProcs | None = None,
) -> None:
    """Return once ``condition()`` is true; fail after ``timeout`` seconds naming ``what`` (and, given
    the fleet, with its services' logs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s" + (f"\n{procs.logs()}" if procs else ""))
