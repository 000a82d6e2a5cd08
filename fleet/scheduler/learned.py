"""A scaling profile learned online from a job's own reports (``profile: learn``): the samples/s it
reported at each size it ran at, extended optimistically where nothing was seen. Pure."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.scheduler.profiles import MEASURED_GPUS_PER_NODE, Profile

#: a learned profile tries at most this many times the most GPUs a job has run at (Pollux's rule:
#: exploration in steps, each measured before the next)
EXPLORE = 2


@dataclass(frozen=True, eq=False)
class LearnedProfile(Profile):
    """A job's scaling learned from its own reports: ``observed`` (GPUs, global batch) -> samples/s.

    Step time at per-GPU batch ``b`` on ``g`` GPUs = ``k * b + sync(g)``: ``k`` (compute per sample)
    from the one-GPU reports, else optimistically from the fastest per sample (as if it had not
    synchronised); ``sync`` from 0 at one GPU, linear between the GPU counts it ran at (their
    reports' time above compute), extended past the largest by the last slope. Optimistic where
    nothing was seen, so the job is tried bigger; never beyond ``EXPLORE`` x the most GPUs it ran
    at (``least``, its smallest size, before any report), never a larger per-GPU batch than
    ``max_local`` (what the job declared fits a GPU's memory) or, undeclared, than it ran at, and
    never a per-GPU batch below the smallest it ran at (1/``EXPLORE`` of it for a fixed batch): a
    step's fixed costs and a synchronisation that compute no longer hides, which the model does not
    have, make a finer split slower than it says (a larger batch is the way to more GPUs).
    With no reports it runs at its smallest size only: ``least`` GPUs at ``min_batch``, the batch it
    was tuned at."""

    least: int = 1
    observed: Mapping[tuple[int, int], float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def max_gpus(self) -> int:
        return max(self.least, EXPLORE * max((g for g, _ in self.observed), default=0))

    @property
    def largest_local(self) -> float:
        """The largest per-GPU batch a GPU may get: ``max_local`` when the job declared it, else the
        largest it ran at; before any report, ``min_batch / least`` (within ``max_local``)."""
        tuned = self.min_batch / self.least
        if self.max_local is not None:
            return float(self.max_local) if self.observed else min(self.max_local, tuned)
        return max([tuned] + [b / g for g, b in self.observed])

    @property
    def smallest_local(self) -> float:
        """The smallest per-GPU batch a GPU may get: the smallest it ran at, or 1/``EXPLORE`` of that
        when its batch is fixed (a finer split is then its only way to more GPUs); before any
        report, ``min_batch / least``."""
        if not self.observed:
            return self.min_batch / self.least
        least = min(b / g for g, b in self.observed)
        return least / EXPLORE if self.min_batch == self.max_batch else least

    def best(
        self,
        gpus: int,
        min_batch: int | None = None,
        max_batch: int | None = None,
        gpus_per_node: int = MEASURED_GPUS_PER_NODE,
        accumulate: bool = False,
    ) -> tuple[float, int]:
        """The largest batch in range that fits (in this model a larger batch is never slower)."""
        lo, hi = self._bounds(min_batch, max_batch)
        batch = min(hi, math.floor(self.largest_local * gpus + 1e-9))
        if gpus < 1 or batch < lo:
            return 0.0, 0
        return self.throughput(gpus, batch, gpus_per_node), batch

    def _step_time(self, placement: tuple[int, ...], local: float, accumulate: bool) -> float | None:
        if not self.smallest_local * (1 - 1e-9) <= local <= self.largest_local * (1 + 1e-9):
            return None
        return self._model[0] * local + self._sync(sum(placement))

    @property
    def _model(self) -> tuple[float, tuple[tuple[int, float], ...]]:
        """(``k``, the sync time at each GPU count it ran at, with (1, 0.0))."""
        found: tuple[float, tuple[tuple[int, float], ...]] | None = self._cache.get(("model",))
        if found is None:
            found = self._cache[("model",)] = _fit(self.observed)
        return found

    def _sync(self, gpus: int) -> float:
        points = self._model[1]  # starts (1, 0.0)
        i = bisect.bisect_left(points, (gpus, -math.inf))
        if i < len(points) and points[i][0] == gpus:
            return points[i][1]
        if len(points) == 1:
            return 0.0  # never ran on more than one GPU: optimistic
        (g0, s0), (g1, s1) = points[i - 1 : i + 1] if i < len(points) else points[-2:]
        return max(s0 + (s1 - s0) * (gpus - g0) / (g1 - g0), 0.0)


def _fit(observed: Mapping[tuple[int, int], float]) -> tuple[float, tuple[tuple[int, float], ...]]:
    seen = [(g, b / g, b / rate) for (g, b), rate in observed.items() if rate > 0]  # (GPUs, local, step)
    if not seen:
        return 1.0, ((1, 0.0),)
    single = [step / local for g, local, step in seen if g == 1]
    k = sum(single) / len(single) if single else min(step / local for _, local, step in seen)
    syncs: dict[int, list[float]] = {}
    for g, local, step in seen:
        if g > 1:
            syncs.setdefault(g, []).append(max(step - k * local, 0.0))
    return k, ((1, 0.0), *sorted((g, sum(s) / len(s)) for g, s in syncs.items()))
