"""Trace readers for ``fleet sim``: the workload format (jobs that train a profiled model) and the
Philly format (jobs that run a duration). Both give :class:`TraceJob`, sorted by arrival."""

from __future__ import annotations

import csv
import datetime
import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from fleet.errors import SpecError

#: the traces bundled in ``fleet/traces``, by the short names ``fleet sim`` accepts
BUNDLED = {
    **{f"workload-{i}": f"workloads/workload-{i}.csv" for i in range(1, 5)},
    "philly": "philly-sep-oct-2017.csv",
}
WORKLOAD_FIELDS = {"name", "time", "application", "num_replicas", "batch_size"}
PHILLY_FIELDS = {"timestamp", "duration", "num_gpus", "cluster"}


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace. ``model``: the profile it trains (its length: the model's epochs at the
    profile's throughput); None: it runs ``duration`` seconds on ``gpus`` GPUs whatever happens."""

    id: str
    tenant: str
    arrival: float
    gpus: int
    batch: int = 0
    model: str | None = None
    duration: float = 0.0


def resolve(trace: str | Path) -> Path:
    """A path, or the name of a bundled trace (``workload-1`` .. ``workload-4``, ``philly``)."""
    path = Path(trace)
    if path.exists():
        return path
    if str(trace) in BUNDLED:
        with resources.as_file(resources.files("fleet") / "traces" / BUNDLED[str(trace)]) as found:
            return found
    raise SpecError(f"no trace {trace}: a CSV file, or one of {', '.join(BUNDLED)}")


def read_trace(
    trace: str | Path, load: float = 1.0, limit: int | None = None, sustain: bool = False
) -> list[TraceJob]:
    """The jobs of a trace file in either format, arrivals divided by ``load`` (2.0: twice as
    many jobs per hour), the first ``limit`` only if given. With ``sustain``, that rate lasts as long
    as the trace did: it is repeated after itself (ids ``<id>#<copy>``), arrivals past the trace's
    span dropped (2.0 over an 8-hour trace: twice its jobs, arriving over the same 8 hours)."""
    if load <= 0:
        raise SpecError(f"--load must be above 0, not {load:g}")
    path = resolve(trace)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = set(reader.fieldnames or ())
        rows = list(reader) if limit is None else [row for _, row in zip(range(limit), reader, strict=False)]
    if fields >= WORKLOAD_FIELDS:
        jobs = [_workload(row) for row in rows]
    elif fields >= PHILLY_FIELDS:
        jobs = _philly(rows)
    else:
        raise SpecError(
            f"{path}: not a trace fleet reads: a workload has columns {', '.join(sorted(WORKLOAD_FIELDS))}; "
            f"a Philly trace {', '.join(sorted(PHILLY_FIELDS))}"
        )
    span = max((j.arrival for j in jobs), default=0.0)
    jobs = [j if load == 1.0 else _scaled(j, load) for j in jobs]
    if sustain and load > 1.0:
        copies = [(k, k * span / load) for k in range(math.ceil(load))]
        jobs = [
            replace(j, id=f"{j.id}#{k}" if k else j.id, arrival=j.arrival + shift)
            for k, shift in copies
            for j in jobs
            if j.arrival + shift <= span
        ]
    return sorted(jobs, key=lambda j: j.arrival)


def _workload(row: dict[str, str]) -> TraceJob:
    """The workloads name no teams: each model's jobs are one tenant (so fair share has tenants)."""
    return TraceJob(
        id=row["name"],
        tenant=row["application"],
        arrival=float(row["time"]),
        gpus=int(row["num_replicas"]),
        batch=int(row["batch_size"]),
        model=row["application"],
    )


def _philly(rows: list[dict[str, str]]) -> list[TraceJob]:
    """One tenant per virtual cluster; arrivals in seconds from the first."""
    utc = datetime.UTC  # naive timestamps: read as UTC, so no daylight saving shifts an arrival
    times = [
        datetime.datetime.fromisoformat(row["timestamp"]).replace(tzinfo=utc).timestamp() for row in rows
    ]
    start = min(times, default=0.0)
    return [
        TraceJob(
            id=f"p{i}",
            tenant=row["cluster"],
            arrival=t - start,
            gpus=max(int(row["num_gpus"]), 1),
            duration=max(float(row["duration"]), 0.0),
        )
        for i, (row, t) in enumerate(zip(rows, times, strict=True))
    ]


def _scaled(job: TraceJob, load: float) -> TraceJob:
    return TraceJob(job.id, job.tenant, job.arrival / load, job.gpus, job.batch, job.model, job.duration)
