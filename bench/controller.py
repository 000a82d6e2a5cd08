"""The real controller, as ``fleet controller`` runs it, that also writes every scheduling pass's
exact duration to a file (one JSON line each: ``{"at": wall clock at the end, "s": seconds}``).

The controller's ``fleet_schedule_pass_seconds`` histogram stops at 2.5 s, and today's passes at
scale take longer; so this taps what the histogram observes rather than the controller's code:
whatever the scheduler rewrite changes, a pass is still what that metric times.
Run: ``python -m bench.controller PASSES.jsonl`` with ``FLEET_*`` settings in the environment.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fleet import log
from fleet.bus import Bus
from fleet.config import load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.state import JobStore, NodeStore, connect

METRIC = "fleet_schedule_pass_seconds"


def tap(registry: Any, out: Path) -> None:
    """Wrap the ``observe`` of the registry's pass histogram to append each value to ``out``."""
    histogram = next((c for c in registry._collector_to_names if getattr(c, "_name", "") == METRIC), None)
    if histogram is None:
        raise SystemExit(f"the controller has no {METRIC} histogram any more: update bench/controller.py")
    observe = histogram.observe
    sink = out.open("a", buffering=1)

    def recording(amount: float, *args: Any, **kwargs: Any) -> None:
        sink.write(json.dumps({"at": time.time(), "s": amount}) + "\n")
        observe(amount, *args, **kwargs)

    histogram.observe = recording


def main() -> int:
    log.setup("INFO")
    settings = load_settings()
    client, keys = connect(settings), Keys(settings.key_prefix)
    service = Controller(settings, JobStore(client, keys), NodeStore(client, keys), Bus(settings))
    tap(service.registry, Path(sys.argv[1]))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: service.stop_event.set())
    service.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
