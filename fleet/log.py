"""Structured service logs: one event per line, ``key=value`` pairs, for journald and grep."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from fleet.errors import ConfigError, FleetError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_name(text: str) -> str:
    """``text`` as one of :data:`LEVELS`, whatever its case (logging itself knows only upper case)."""
    if text.upper() not in LEVELS:
        raise ConfigError(f"unknown level {text!r}: choose from {', '.join(LEVELS).lower()}")
    return text.upper()


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_name(level))
    logging.getLogger("dramatiq").setLevel("WARNING")
    handler.addFilter(OncePerOutage())


class OncePerOutage(logging.Filter):
    """Let dramatiq's consumer-restart lines through once a minute, not once a second per queue."""

    NOISY = ("Consumer encountered a connection error", "Restarting consumer")

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("dramatiq"):
            return True
        key = next((n for n in self.NOISY if str(record.msg).startswith(n)), None)
        if key is None:
            return True
        now = record.created
        if now - self._last.get(key, 0.0) < self.every_s:
            return False
        self._last[key] = now
        return True


class StepHealth:
    """Run a service's loop steps so that none can stop the loop: a failing step is logged once
    when it starts failing and once when it recovers, not on every iteration."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._since: dict[str, float] = {}

    def guard(self, step: Callable[[], object], **fields: Any) -> None:
        name = getattr(step, "__name__", "step")
        try:
            step()
        except FleetError as exc:
            self.failed(name, exc, time.monotonic(), **fields)
            return
        except Exception:
            self.logger.exception(kv(f"{name}_crashed", **fields))
            return
        self.ok(name, time.monotonic(), **fields)

    def failed(self, step: str, error: object, now: float, **fields: Any) -> None:
        if step not in self._since:
            self._since[step] = now
            event(self.logger, f"{step}_failing", logging.WARNING, error=error, **fields)

    def ok(self, step: str, now: float, **fields: Any) -> None:
        since = self._since.pop(step, None)
        if since is not None:
            event(self.logger, f"{step}_recovered", after_s=f"{now - since:.1f}", **fields)


def kv(event: str, **fields: Any) -> str:
    """``event key=value ...`` with values quoted when they contain spaces."""
    parts = [event]
    for key, value in fields.items():
        if value is None:
            continue
        text = str(value)
        parts.append(f"{key}={text!r}" if (" " in text or not text) else f"{key}={text}")
    return " ".join(parts)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, kv(name, **fields))
