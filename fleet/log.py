"""Structured service logs: one event per line, ``key=value`` pairs, for journald and grep."""

from __future__ import annotations

import logging
import sys
from typing import Any


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("dramatiq").setLevel("WARNING")


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
