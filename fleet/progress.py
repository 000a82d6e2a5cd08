"""A job's progress: the ``fleet-progress {json}`` lines ``fleet_worker.progress`` prints, read back
(the agent's log shipping keeps the last one of the current attempt in the job record), and drawn
the same way by ``fleet jobs``, ``fleet show``, ``fleet logs -f`` and the status page."""

from __future__ import annotations

import json
import math

from fleet.models import Progress

PREFIX = "fleet-progress "
#: the metric by which a report says its attempt follows a batch change while it runs (an elastic
#: job's ``fleet_worker.batch_size(follow=True)``): fleet changes its batch alone without a restart
FOLLOWS_BATCH = "follows_batch"
#: metrics kept with a report: the first this many numeric ones, names this long at most
METRICS_MAX, METRIC_NAME_MAX = 16, 64


def parse_line(line: str, now: float) -> Progress | None:
    """The report a log line holds, or None (not a progress line, or one that cannot be read: a job
    prints what it likes, so nothing here may raise). ``now``: its time, if the line has none."""
    if not line.startswith(PREFIX):
        return None
    try:
        data = json.loads(line[len(PREFIX) :])
        step, total = data.pop("step"), data.pop("total", None)
        at = data.pop("at", now)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not _whole(step) or step < 0 or (total is not None and (not _whole(total) or total < 1)):
        return None
    metrics = {str(k)[:METRIC_NAME_MAX]: float(v) for k, v in data.items() if _number(v) and math.isfinite(v)}
    when = float(at) if _number(at) and math.isfinite(at) else now
    return Progress(step=step, total=total, at=when, metrics=dict(list(metrics.items())[:METRICS_MAX]))


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def last_report(lines: list[str], now: float) -> Progress | None:
    """The newest readable report among ``lines`` (oldest first)."""
    for line in reversed(lines):
        if (found := parse_line(line, now)) is not None:
            return found
    return None


def follows_batch(progress: Progress | None) -> bool:
    """Whether the attempt that made this report follows a batch change while it runs."""
    return bool(progress and progress.metrics.get(FOLLOWS_BATCH))


def label(progress: Progress | None) -> str:
    """A table cell: ``45%`` against a total, else ``step 1200``; ``-`` without a report."""
    if progress is None:
        return "-"
    if progress.fraction is not None:
        return f"{progress.fraction * 100:.0f}%"
    return f"step {progress.step}"


def bar(progress: Progress, width: int = 24) -> str:
    """One line: ``[#########---------------]  38% step 450/1200 loss=0.12``."""
    steps = f"step {progress.step}" + (f"/{progress.total}" if progress.total else "")
    metrics = " ".join(f"{k}={v:.4g}" for k, v in progress.metrics.items())
    if progress.fraction is None:
        return " ".join(part for part in (steps, metrics) if part)
    filled = round(progress.fraction * width)
    drawn = f"[{'#' * filled}{'-' * (width - filled)}] {progress.fraction * 100:3.0f}%"
    return " ".join(part for part in (drawn, steps, metrics) if part)
