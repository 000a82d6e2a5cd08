"""A scaling profile learned online from a job's own reports (``profile: learn``): the samples/s it
reported at each size it ran at, extended optimistically where nothing was seen. Pure."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from fleet.scheduler.profiles import MEASURED_GPUS_PER_NODE, Profile

#: a learned profile tries at most this many times the most GPUs a job has run at (Pollux's rule:
#: exploration in steps, each measured before the next)
EXPLORE = 2


@dataclass(frozen=True, eq=False)
class LearnedProfile(Profile):
    """A job's scaling learned from its own reports: ``observed`` (GPUs, global batch) -> samples/s.

    Step time at per-GPU batch ``b`` on ``g`` GPUs = ``fixed + per_sample x b + sync(g)``, fitted to
    every report at once (:func:`_fit`): ``fixed`` is what a step costs whatever its batch (why a
    finer split gains less than its share of samples), ``sync`` 0 at one GPU, linear between the GPU
    counts it ran at, past the largest the same as there if the job ran faster there than at the
    count before (else along the last two). Within one node and across nodes are learned apart
    (Pollux's intra- and inter-node terms): a size across nodes follows the counts run across nodes
    only, or, before any, those within one. Optimistic where nothing was seen, so the job is tried
    bigger; never beyond ``EXPLORE`` x the most GPUs it ran at (``least``, its smallest size, before
    any report), and never a larger per-GPU batch than ``max_local`` (what the job declared fits a
    GPU's memory) or, undeclared, than it ran at, in one pass: sized by goodput (``accumulate``), a
    larger one is several micro-batches of at most that, each costing the fixed part and its
    samples' again, and one synchronisation.
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
        """The smallest per-GPU batch a GPU may get: any, once it reported (the model's fixed cost
        per step says what a finer split is worth); before, ``min_batch / least``."""
        return 0.0 if self.observed else self.min_batch / self.least

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

    def _step_time(
        self, placement: tuple[int, ...], local: float, accumulate: bool, gpus_per_node: int
    ) -> float | None:
        largest = self.largest_local
        steps = max(1, math.ceil(local / largest - 1e-9)) if accumulate and self.observed else 1
        local /= steps
        if not self.smallest_local * (1 - 1e-9) <= local <= largest * (1 + 1e-9):
            return None
        fixed, per_sample, _, _ = self._model
        return steps * (fixed + per_sample * local) + self._sync(sum(placement), gpus_per_node)

    @property
    def _model(self) -> Model:
        found: Model | None = self._cache.get(("model",))
        if found is None:
            found = self._cache[("model",)] = _fit(self.observed)
        return found

    def _sync(self, gpus: int, per_node: int) -> float:
        """The synchronisation of a step on ``gpus`` GPUs, from the counts run at on the same side of
        a node's edge (within one node of ``per_node`` GPUs, or across nodes: Pollux's intra- and
        inter-node terms); across nodes before any run there, as within (Pollux's prior)."""
        model = self._model
        across = gpus > per_node
        points = [(g, s) for g, s in model.syncs if (g > per_node) == across]
        if not points:
            points = [(g, s) for g, s in model.syncs if g <= per_node]
        counts = {g for g, _ in points}
        return _along(points, {g: r for g, r in model.rates if g in counts}, gpus)


def _along(points: list[tuple[int, float]], rates: Mapping[int, float], gpus: int) -> float:
    """The synchronisation at ``gpus`` from ``points`` (GPU count, seconds), ascending: linear between
    two; below the first, as there; past the last, as there when it is the only one or ran faster
    than the one before (``rates``: the best samples/s at each count run at), else along the line
    through the last two (a job that did not gain is not pushed further)."""
    i = bisect.bisect_left(points, (gpus, -math.inf))
    if i < len(points) and points[i][0] == gpus:
        return points[i][1]
    if i == 0 or len(points) == 1:
        return points[0][1]
    if i == len(points):
        counted = sorted(rates)
        if len(counted) < 2 or rates[counted[-1]] > rates[counted[-2]]:
            return points[-1][1]
    (g0, s0), (g1, s1) = points[i - 1 : i + 1] if i < len(points) else points[-2:]
    return max(s0 + (s1 - s0) * (gpus - g0) / (g1 - g0), 0.0)


class Model(NamedTuple):
    """What :func:`_fit` learned of a job's step time."""

    #: seconds a step takes whatever its batch
    fixed: float
    #: seconds each sample of a GPU's share takes
    per_sample: float
    #: the synchronisation's seconds at each GPU count it ran at, with (1, 0.0)
    syncs: tuple[tuple[int, float], ...]
    #: the best samples/s it reported at each GPU count it ran at: past the largest count on its side
    #: of a node's edge, the synchronisation stays as there (Pollux's model with no growth seen
    #: beyond) only when that count was faster than the one before. Drawn along the line, a job whose
    #: batch grew with its GPUs (cifar10 in Pollux's simulator) looked slower on twice the GPUs and
    #: was never tried there
    rates: tuple[tuple[int, float], ...]


def _fit(observed: Mapping[tuple[int, int], float]) -> Model:
    """Least squares over every report (each weighted by 1/its step time: relative error) of
    ``step = fixed + per_sample x b + sync(g)``, one unknown sync per GPU count run at beyond the
    smallest (0 there: optimistic). A prior (:data:`PRIOR`) puts half of the smallest size's step in
    ``fixed`` (Pollux's prior, from one batch): it settles what the reports cannot, and leans the fit
    that way where they are few."""
    seen = [(g, b / g, b / rate) for (g, b), rate in observed.items() if rate > 0]  # (GPUs, local, step)
    if not seen:
        return Model(0.0, 1.0, ((1, 0.0),), ())
    least = min(g for g, _, _ in seen)
    counts = sorted({g for g, _, _ in seen if g > least})
    rows, wanted = [], []
    for g, local, step in seen:
        rows.append([1.0, local] + [float(g == c) for c in counts])
        wanted.append(step)
    base = [step for g, _, step in seen if g == least]
    prior = sum(base) / len(base) / 2
    import numpy as np  # here: the agent, the API and the CLI import this module, and fit nothing

    weights = np.array([*(1 / t for t in wanted), PRIOR / prior])
    design = np.vstack([np.array(rows), [1.0] + [0.0] * (1 + len(counts))]) * weights[:, None]
    target = np.array([*wanted, prior]) * weights
    solved = np.linalg.lstsq(design, target, rcond=None)[0]
    fixed, per_sample = max(float(solved[0]), 0.0), float(solved[1])
    if per_sample <= 0:  # noisy reports: fall back to the smallest size's cost per sample
        fixed, per_sample = 0.0, min(step / local for g, local, step in seen if g == least)
    syncs = [(c, max(float(v), 0.0)) for c, v in zip(counts, solved[2:], strict=True)]
    start = [(least, 0.0)] if least > 1 else []
    rates = {g: max(rate for (n, _), rate in observed.items() if n == g) for g, _, _ in seen}
    return Model(fixed, per_sample, ((1, 0.0), *start, *syncs), tuple(sorted(rates.items())))


#: the weight of the prior on ``fixed`` against one report's (1: as much as a report), chosen in
#: bench/pollux.py (BENCHMARKS.md)
PRIOR = 0.3
