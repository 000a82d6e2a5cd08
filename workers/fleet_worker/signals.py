"""SIGTERM means 'checkpoint and leave': fleet sends it on cancel, drain and preemption."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

_stop = threading.Event()
#: exit status after a SIGTERM checkpoint: 128 + SIGTERM, so nobody mistakes it for success
TERMINATED = 143


def stop_requested() -> threading.Event:
    """Install a SIGTERM handler that sets the returned event; the loop checkpoints and exits."""
    signal.signal(signal.SIGTERM, lambda *_: _stop.set())
    return _stop


def exit_after_checkpoint() -> None:
    print(f"fleet_worker: stopping on SIGTERM after checkpoint (exit {TERMINATED})", flush=True)
    sys.exit(TERMINATED)


def progress(step: int, total: int | None = None, **metrics: float) -> None:
    """One machine-readable progress line on stdout: ``fleet logs`` shows it, and fleet keeps the
    attempt's last one as the job's progress (``fleet jobs`` PROGRESS, a bar in ``fleet show``,
    ``fleet logs -f`` and the status page). ``total``: the run's steps (a percentage is drawn
    against it); ``metrics``: numbers worth seeing beside it (loss=0.12, samples_s=810)."""
    report: dict[str, Any] = {"step": int(step), "at": time.time()}
    if total is not None:
        report["total"] = int(total)
    print("fleet-progress " + json.dumps({**report, **metrics}), flush=True)
