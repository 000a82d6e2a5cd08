"""Decayed usage: GPU-seconds where each second's weight halves every ``half_life`` (Slurm's
PriorityDecayHalfLife), so last month's burst weighs little and last hour's a lot.

Usage is folded forward in steps: over a step of ``dt`` seconds the old total decays by
``2^(-dt/h)`` and what ran during the step adds its exact decayed integral, so a leader folding
every few seconds and one folding after a failover agree. Pure; the leader stores the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: usage below this (GPU-seconds) is forgotten: a tenant idle for long enough leaves no record
FORGET_BELOW = 1.0


def decay(half_life: float, dt: float) -> float:
    """The factor usage decays by over ``dt`` seconds."""
    return math.exp(-math.log(2) * max(dt, 0.0) / half_life)


def window(half_life: float) -> float:
    """Seconds of the whole fleet's use that a tenant using everything forever accumulates per GPU:
    the integral of the decay (``h / ln 2``). Usage divided by this and the fleet's GPUs is the
    average fraction of the fleet a tenant held, comparable with its current share."""
    return half_life / math.log(2)


def accrue(
    usage: Mapping[str, float], allocated: Mapping[str, float], dt: float, half_life: float
) -> dict[str, float]:
    """Usage after ``dt`` more seconds during which each tenant held ``allocated`` GPUs; tenants whose
    usage fell below :data:`FORGET_BELOW` and hold nothing are dropped."""
    dt = max(dt, 0.0)
    factor = decay(half_life, dt)
    gained = window(half_life) * (1.0 - factor)  # integral of the decay over the step, per GPU
    out = {}
    for tenant in set(usage) | set(allocated):
        value = usage.get(tenant, 0.0) * factor + allocated.get(tenant, 0.0) * gained
        if value >= FORGET_BELOW or allocated.get(tenant, 0.0) > 0:
            out[tenant] = value
    return out
