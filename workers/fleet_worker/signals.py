"""SIGTERM means 'checkpoint and leave': fleet sends it on cancel, drain and preemption."""

from __future__ import annotations

import json
import math
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
    signal.signal(signal.SIGTERM, _on_sigterm)
    return _stop


def _on_sigterm(*_: object) -> None:
    """Set the flag from another thread: ``Event.set`` takes a lock, and a second SIGTERM arriving
    while the first one's handler holds it (a process group's signal, then a launcher forwarding its
    own) would wait for it forever in the same thread."""
    if not _stop.is_set():
        threading.Thread(target=_stop.set, name="fleet-sigterm", daemon=True).start()


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


class _Throughput:
    """When the last report was (None: none yet) and how many there were."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.steps = 0


_reported = _Throughput()


def report(
    samples: int, step: int | None = None, *, gns: Any = None, batch_size: int | None = None, **metrics: Any
) -> float:
    """A progress line (as ``progress``) with the samples/s since the last report: ``samples`` is how
    many the job processed since then (all its GPUs together). ``step`` defaults to the count of
    reports so far. Returns the samples/s; the first report of a process has none (0.0: what came
    before it was start-up, not training). Elastic jobs report what they run at too (``num_gpus``,
    and ``batch_size``: ``FLEET_BATCH_SIZE``, or what ``batch_size(follow=True)`` last gave, unless
    the job says it runs another), and fleet learns their scaling from it (``profile: learn``). A job
    that asked ``batch_size(follow=True)`` reports ``follows_batch`` too: fleet then changes its batch
    alone while it runs, without a restart. ``gns``: the job's gradient noise scale in samples (a
    number, or its ``fw.GradientNoiseScale``), reported as ``gns`` once known: fleet weighs the
    job's samples/s by how much each is worth at its batch (its goodput)."""
    from fleet_worker.env import batch_size as env_batch_size
    from fleet_worker.env import followed_batch, num_gpus, num_nodes

    now = time.monotonic()
    elapsed, _reported.since = (None if _reported.since is None else now - _reported.since), now
    _reported.steps += 1
    rate = samples / elapsed if elapsed else 0.0
    followed = followed_batch()
    now_at = followed if followed is not None else env_batch_size()
    sized: dict[str, Any] = {
        "num_gpus": num_gpus() * num_nodes(),
        "batch_size": batch_size if batch_size is not None else now_at,
    }
    if followed is not None:
        sized["follows_batch"] = 1
    if elapsed:
        sized["samples_per_s"] = round(rate, 3)
    noise = getattr(gns, "noise_scale", gns)
    if noise is not None and math.isfinite(noise) and noise >= 0:
        sized["gns"] = float(f"{noise:.6g}")
    progress(
        _reported.steps if step is None else step,
        **{k: v for k, v in sized.items() if v is not None},
        **metrics,
    )
    return rate
