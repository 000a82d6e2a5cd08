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


def progress(step: int, **metrics: Any) -> None:
    """One machine-readable progress line on stdout (it lands in `fleet logs`)."""
    print("fleet-progress " + json.dumps({"step": step, "at": time.time(), **metrics}), flush=True)
