"""``fleet sim``: a trace on a virtual clock, scheduled by the controller's own pass
(``fleet.scheduler.passes.run_pass``: the elastic policy, the queue, capacity and gangs, fair share,
preemption). No Redis, no services."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from fleet.models import Tenant
from fleet.sim.engine import Simulation, simulate
from fleet.sim.metrics import SimResult, Stats
from fleet.sim.model import ELASTIC, POLICIES, SimConfig
from fleet.sim.traces import BUNDLED, TraceJob, read_trace, resolve

__all__ = [
    "BUNDLED",
    "ELASTIC",
    "POLICIES",
    "SimConfig",
    "SimResult",
    "Simulation",
    "Stats",
    "TraceJob",
    "read_trace",
    "resolve",
    "run",
    "simulate",
]


def run(
    trace: str | Path,
    policy: str = "fifo",
    gpus: int = 64,
    nodes: int | None = None,
    load: float = 1.0,
    until: float | None = None,
    weights: Mapping[str, float] | None = None,
    tenants: Mapping[str, Tenant] | None = None,
    limit: int | None = None,
    sustain: bool = False,
    **options: object,
) -> SimResult:
    """Simulate ``trace`` (a CSV path or a bundled name: ``workload-1`` .. ``workload-4``,
    ``philly``) under ``policy`` on ``gpus`` GPUs over ``nodes`` nodes (default: 4 GPUs each), its
    arrivals compressed by ``load`` (with ``sustain``, that rate kept for the trace's whole span: see
    :func:`read_trace`), until ``until`` seconds (default: every job ended).
    ``weights``: tenants' fair-share weights (shorthand for ``tenants``). Other ``options`` go to
    :class:`SimConfig` (``resize_cost_s``, ``min_interval_s``, ``accumulate``, ...)."""
    policies = dict(tenants or {})
    for name, weight in (weights or {}).items():
        base = policies.get(name) or Tenant(name=name)
        policies[name] = base.model_copy(update={"weight": weight})
    config = SimConfig(policy=policy, gpus=gpus, nodes=nodes, until=until, tenants=policies, **options)  # type: ignore[arg-type]
    jobs = read_trace(trace, load, limit, sustain)
    started = time.perf_counter()
    result = simulate(jobs, config)
    result.wall_s = round(time.perf_counter() - started, 3)
    result.trace, result.load, result.sustained = str(trace), load, sustain and load > 1.0
    return result
