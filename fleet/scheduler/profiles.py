"""Scaling profiles: how fast one model trains on N GPUs at global batch B. Pure.

Three kinds, one interface (:class:`Profile`: ``throughput``, ``best``, ``max_gpus``):
- measured, in the profiles format (``fleet/traces/profiles``, Pollux's traces: step times per
  placement and per-GPU batch): the bundled ones by name (:func:`named_profile`), or a user's own
  directory read by :func:`read_profile` and sent as data (:func:`profile_data`, :func:`from_data`);
- learned online (``fleet.scheduler.learned.LearnedProfile``) from the samples/s a job reported at
  each size it ran at.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from fleet.scheduler.capacity import even_split

#: the bundled profiles (``fleet/traces/profiles``)
PROFILES = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
#: training length of each bundled model in epochs, as the Pollux simulator uses them
EPOCHS = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50}
#: the largest per-GPU batch that fits a GPU, where it is below the largest measured (Pollux's limit)
MAX_LOCAL = {"yolov3": 8}
#: the most GPUs per node the profiles were measured with (a member bigger than this counts as
#: several measured nodes: a conservative estimate for 8-GPU nodes)
MEASURED_GPUS_PER_NODE = 4

#: (per-GPU batch sizes ascending, seconds per step at each, seconds of it spent synchronising)
Curve = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]
#: a placement's curves to blend (weight, curve): one when measured, two between measured GPU counts
Blend = tuple[tuple[float, Curve], ...]


@dataclass(frozen=True, eq=False)
class Profile:
    """Throughput of one model. ``min_batch``/``max_batch``: the global batch range in which its
    accuracy holds; ``epochs`` x ``epoch_samples``: the samples one training run processes;
    ``max_local``: the largest per-GPU batch that fits a GPU's memory (None: the largest measured)."""

    name: str
    min_batch: int
    max_batch: int
    epochs: int = 1
    epoch_samples: int = 0
    max_local: int | None = None
    #: measured placements (GPUs on each 4-GPU node, ascending) -> step times by per-GPU batch
    placements: Mapping[tuple[int, ...], Curve] = field(default_factory=dict, repr=False, compare=False)
    #: larger placements: (nodes, GPUs) -> step times by per-GPU batch
    scalability: Mapping[tuple[int, int], Curve] = field(default_factory=dict, repr=False, compare=False)
    #: the gradient noise scale (samples) in each epoch of a run, as measured (``validation-<B>.csv`` at
    #: the smallest B: ``grad_var / grad_sqr x B``); empty: not known, throughput is all that counts
    noise: tuple[float, ...] = field(default=(), repr=False, compare=False)
    #: throughputs, best batches and size curves worked out so far (a profile is equal only to itself)
    _cache: dict[tuple[object, ...], Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def samples(self) -> int:
        """Samples one training run processes (epochs x samples per epoch)."""
        return self.epochs * self.epoch_samples

    def noise_scale(self, done: float) -> float | None:
        """The noise scale in the epoch a run is in after ``done`` samples; None when not measured."""
        if not self.noise:
            return None
        epoch = int(done / self.epoch_samples + 1e-6) if self.epoch_samples > 0 else 0
        return self.noise[min(max(epoch, 0), len(self.noise) - 1)]

    @property
    def max_gpus(self) -> int:
        """The most GPUs measured: beyond, the throughput is 0 (no guessing)."""
        return max([sum(p) for p in self.placements] + [r for _, r in self.scalability], default=0)

    def placement(self, gpus: int, gpus_per_node: int = MEASURED_GPUS_PER_NODE) -> tuple[int, ...]:
        """The GPUs on each measured node when fleet places ``gpus`` GPUs on nodes of
        ``gpus_per_node``: equal members (``capacity.even_split``), each member bigger than a
        measured node counted as several."""
        members, per = even_split(gpus, gpus_per_node)
        parts, each = even_split(per, MEASURED_GPUS_PER_NODE)
        return (each,) * (members * parts)

    def throughput(
        self, gpus: int, batch: int, gpus_per_node: int = MEASURED_GPUS_PER_NODE, accumulate: bool = False
    ) -> float:
        """Samples/s at global batch ``batch`` on ``gpus`` GPUs; 0.0 where infeasible (batch outside
        the model's range, per-GPU batch outside what was measured or fits, more GPUs than
        measured). With ``accumulate``, a per-GPU batch above the largest that fits is reached by
        gradient accumulation (s steps of compute per synchronisation, as Pollux models it). Step
        times are interpolated linearly between measured per-GPU batches, and between measured GPU
        counts for placements not measured as such."""
        if gpus < 1 or not self.min_batch <= batch <= self.max_batch:
            return 0.0
        key = ("t", gpus, batch, gpus_per_node, accumulate)
        found = self._cache.get(key)
        if found is None:
            placement = self.placement(gpus, gpus_per_node)
            step = self._step_time(placement, batch / gpus, accumulate, gpus_per_node)
            found = self._cache[key] = batch / step if step else 0.0
        return float(found)

    def best(
        self,
        gpus: int,
        min_batch: int | None = None,
        max_batch: int | None = None,
        gpus_per_node: int = MEASURED_GPUS_PER_NODE,
        accumulate: bool = False,
    ) -> tuple[float, int]:
        """The highest throughput on ``gpus`` GPUs at a global batch in [min_batch, max_batch]
        (default: the model's range) and that batch; (0.0, 0) when none is feasible. Candidates:
        the range's ends and every measured per-GPU batch in between, as multiples of ``gpus``."""
        lo, hi = self._bounds(min_batch, max_batch)
        key = ("b", gpus, lo, hi, gpus_per_node, accumulate)
        found = self._cache.get(key)
        if found is not None:
            return tuple(found)
        best = (0.0, 0)
        if gpus >= 1 and lo <= hi:
            candidates = {lo, hi, hi // gpus * gpus, -(-lo // gpus) * gpus}
            for _, curve in self._blend(self.placement(gpus, gpus_per_node)):
                candidates.update(int(local) * gpus for local in curve[0])
            for batch in sorted(candidates):
                if lo <= batch <= hi:
                    t = self.throughput(gpus, batch, gpus_per_node, accumulate)
                    if t > best[0] * (1 + 1e-9):
                        best = (t, batch)
        self._cache[key] = best
        return best

    def _bounds(self, min_batch: int | None, max_batch: int | None) -> tuple[int, int]:
        """The global batch range asked for, within the model's."""
        lo = max(self.min_batch, min_batch if min_batch is not None else self.min_batch)
        return lo, min(self.max_batch, max_batch if max_batch is not None else self.max_batch)

    def _blend(self, placement: tuple[int, ...]) -> Blend:
        """The measured curves a placement's step times come from: its own when measured, else the
        fewest measured nodes at least its nodes (the most when none), between the measured GPU
        counts around its own; () beyond the most GPUs measured."""
        curve = self.placements.get(placement)
        if curve is not None:
            return ((1.0, curve),)
        groups = sorted({n for n, _ in self.scalability})
        if not groups:
            return ()
        nodes, replicas = len(placement), sum(placement)
        group = next((n for n in groups if n >= nodes), groups[-1])
        counts = sorted(r for n, r in self.scalability if n == group)
        if replicas > counts[-1] and group == groups[-1]:
            return ()
        replicas = min(max(replicas, counts[0]), counts[-1])
        i = bisect.bisect_left(counts, replicas)
        if counts[i] == replicas:
            return ((1.0, self.scalability[(group, replicas)]),)
        below, above = counts[i - 1], counts[i]
        w = (replicas - below) / (above - below)
        return ((1 - w, self.scalability[(group, below)]), (w, self.scalability[(group, above)]))

    def _step_time(
        self, placement: tuple[int, ...], local: float, accumulate: bool, gpus_per_node: int
    ) -> float | None:
        """Seconds per optimizer step at per-GPU batch ``local`` (``placement``: GPUs on each measured
        node; ``gpus_per_node``: the fleet's nodes), None where not measured."""
        blend = self._blend(placement)
        if not blend:
            return None
        largest = min(curve[0][-1] for _, curve in blend)
        if self.max_local is not None:
            largest = min(largest, self.max_local)
        steps = max(1, math.ceil(local / largest - 1e-9)) if accumulate else 1
        local /= steps
        if local > largest * (1 + 1e-9):
            return None
        step = sync = 0.0
        for weight, curve in blend:
            at = _interp(curve, local)
            if at is None:
                return None
            step, sync = step + weight * at[0], sync + weight * at[1]
        return step + (steps - 1) * (step - sync)


def _interp(curve: Curve, x: float) -> tuple[float, float] | None:
    """(step time, sync time) at per-GPU batch ``x``, linear between measured points."""
    xs, steps, syncs = curve
    if not xs or x < xs[0] * (1 - 1e-9) or x > xs[-1] * (1 + 1e-9):
        return None
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and math.isclose(xs[i], x, rel_tol=1e-9):
        return steps[i], syncs[i]
    i = min(max(i, 1), len(xs) - 1)
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return steps[i - 1] + (steps[i] - steps[i - 1]) * w, syncs[i - 1] + (syncs[i] - syncs[i - 1]) * w


Points = dict[object, dict[float, list[tuple[float, float]]]]


def _curves(rows: Points) -> dict[object, Curve]:
    out: dict[object, Curve] = {}
    for key, points in rows.items():
        xs = tuple(sorted(points))
        steps = tuple(sum(p[0] for p in points[x]) / len(points[x]) for x in xs)
        syncs = tuple(sum(p[1] for p in points[x]) / len(points[x]) for x in xs)
        out[key] = (xs, steps, syncs)
    return out


def _read(path: Path, key: Callable[[dict[str, str]], object], into: Points) -> None:
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            point = (float(row["step_time"]), float(row["sync_time"]))
            into.setdefault(key(row), {}).setdefault(float(row["local_bsz"]), []).append(point)


def load_profile(
    directory: Path | str, name: str | None = None, epochs: int | None = None, max_local: int | None = None
) -> Profile:
    """A model's profile from a directory in the profiles format: ``placements.csv``,
    ``scalability.csv`` (optional) and ``validation-<B>.csv`` (the batch range: smallest and largest
    B; an epoch: the first row's ``progress`` x the smallest B samples; the epochs: its rows, unless
    ``epochs`` says, or the model is one of the bundled ones)."""
    directory = Path(directory)
    name = name or directory.name
    placed: Points = {}
    _read(
        directory / "placements.csv",
        lambda row: tuple(sorted(int(d) for d in row["placement"].strip())),
        placed,
    )
    scaled: Points = {}
    if (directory / "scalability.csv").exists():
        _read(
            directory / "scalability.csv",
            lambda row: (int(row["num_nodes"]), int(row["num_replicas"])),
            scaled,
        )
    batches = sorted(
        int(m.group(1))
        for p in directory.glob("validation-*.csv")
        if (m := re.fullmatch(r"validation-(\d+)\.csv", p.name))
    )
    if not batches:
        raise ValueError(f"{directory}: no validation-<batch>.csv (the batch range comes from them)")
    with open(directory / f"validation-{batches[0]}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    epoch = round(float(rows[0]["progress"]) * batches[0]) if rows else 0
    noise: list[float] = []
    for row in rows if {"grad_sqr", "grad_var"} <= set(rows[0] if rows else ()) else []:
        sqr, var = float(row["grad_sqr"]), float(row["grad_var"])
        # an epoch whose gradient vanished (sqr 0) keeps the last finite scale
        noise.append(var / sqr * batches[0] if sqr > 0 else (noise[-1] if noise else 0.0))
    return Profile(
        name=name,
        min_batch=batches[0],
        max_batch=batches[-1],
        epochs=epochs or EPOCHS.get(name, len(rows)),
        epoch_samples=epoch,
        max_local=max_local if max_local is not None else MAX_LOCAL.get(name),
        placements=_curves(placed),  # type: ignore[arg-type]
        scalability=_curves(scaled),  # type: ignore[arg-type]
        noise=tuple(noise),
    )


@cache
def named_profile(name: str) -> Profile:
    """A bundled profile: one of :data:`PROFILES`."""
    if name not in PROFILES:
        raise ValueError(f"no profile named {name!r}: bundled are {', '.join(PROFILES)}")
    with resources.as_file(resources.files("fleet") / "traces" / "profiles" / name) as path:
        return load_profile(path, name)


#: limits on a profile sent as data, a few times the bundled ones' (105 curves, at most 21 points in
#: one and 1,537 in all): the leader works out sizes from every point, in its passes
MAX_CURVES, MAX_CURVE_POINTS, MAX_POINTS = 512, 128, 10_000


def profile_data(profile: Profile) -> dict[str, Any]:
    """``profile`` as JSON-able data (what a client sends; :func:`from_data` reads it back): each
    curve as ``[[per-GPU batch, step time, sync time], ...]``, placements keyed as in
    ``placements.csv`` (``"22"``), larger ones as ``"<nodes>x<GPUs>"``."""

    def points(curve: Curve) -> list[list[float]]:
        return [list(p) for p in zip(*curve, strict=True)]

    return {
        "name": profile.name,
        "min_batch": profile.min_batch,
        "max_batch": profile.max_batch,
        "epochs": profile.epochs,
        "epoch_samples": profile.epoch_samples,
        "max_local": profile.max_local,
        "placements": {"".join(map(str, k)): points(c) for k, c in profile.placements.items()},
        "scalability": {f"{n}x{r}": points(c) for (n, r), c in profile.scalability.items()},
    }


def from_data(data: Any) -> Profile:
    """The profile in ``data`` (as :func:`profile_data` writes it), checked: ValueError naming the
    field that is wrong otherwise."""
    if not isinstance(data, dict):
        raise ValueError("profile: expected an object with min_batch, max_batch and placements")
    unknown = set(data) - {
        "name",
        "min_batch",
        "max_batch",
        "epochs",
        "epoch_samples",
        "max_local",
        "placements",
        "scalability",
    }
    if unknown:
        raise ValueError(f"profile: unknown field {sorted(unknown)[0]!r}")
    name = data.get("name", "profile")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ValueError("profile.name: 1-64 letters, digits, '_', '.', '-'")
    low, high = _count(data, "min_batch"), _count(data, "max_batch")
    if high < low:
        raise ValueError(f"profile.max_batch: {high} is below min_batch {low}")
    max_local = None if data.get("max_local") is None else _count(data, "max_local")
    placed = _curve_map(
        data.get("placements"), "placements", r"[1-9]{1,64}", lambda k: tuple(sorted(map(int, k)))
    )
    scaled = _curve_map(
        data.get("scalability", {}),
        "scalability",
        r"[1-9]\d{0,3}x[1-9]\d{0,4}",
        lambda k: tuple(int(x) for x in k.split("x")),
    )
    if not placed:
        raise ValueError('profile.placements: at least one measured placement (e.g. "1": one GPU)')
    if sum(len(c[0]) for c in [*placed.values(), *scaled.values()]) > MAX_POINTS:
        raise ValueError(f"profile: more than {MAX_POINTS} measured points")
    return Profile(
        name=name,
        min_batch=low,
        max_batch=high,
        epochs=_count(data, "epochs", 1),
        epoch_samples=_count(data, "epoch_samples", 0, least=0),
        max_local=max_local,
        placements=placed,
        scalability=scaled,  # type: ignore[arg-type]
    )


def _count(data: dict[str, Any], key: str, default: int | None = None, least: int = 1) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 1 << 40:
        raise ValueError(f"profile.{key}: a whole number of at least {least} (got {str(value)[:40]!r})")
    return value


def _curve_map(
    value: Any, field_name: str, key_pattern: str, parse: Callable[[str], tuple[int, ...]]
) -> dict[tuple[int, ...], Curve]:
    if not isinstance(value, dict) or len(value) > MAX_CURVES:
        raise ValueError(f"profile.{field_name}: an object of at most {MAX_CURVES} curves")
    out = {}
    for key, points in value.items():
        where = f"profile.{field_name}[{str(key)[:20]!r}]"
        if not isinstance(key, str) or not re.fullmatch(key_pattern, key):
            raise ValueError(
                f'{where}: not a placement ("22": 2 + 2 GPUs on two nodes; "6x24": 6 nodes, 24 GPUs)'
            )
        if not isinstance(points, list) or not points or len(points) > MAX_CURVE_POINTS:
            raise ValueError(f"{where}: a list of 1-{MAX_CURVE_POINTS} [per-GPU batch, step time, sync time]")
        rows = sorted(_point(p, where) for p in points)
        if any(a[0] == b[0] for a, b in itertools.pairwise(rows)):
            raise ValueError(f"{where}: one point per per-GPU batch")
        out[parse(key)] = tuple(tuple(c) for c in zip(*rows, strict=True))
    return out  # type: ignore[return-value]


def _point(point: Any, where: str) -> tuple[float, float, float]:
    ok = (
        isinstance(point, list)
        and len(point) == 3
        and all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in point)
    )
    if not ok or not (point[0] > 0 and point[1] > 0 and 0 <= point[2] <= point[1]):
        raise ValueError(
            f"{where}: [per-GPU batch > 0, step time > 0, 0 <= sync time <= step time], got {str(point)[:60]}"
        )
    return float(point[0]), float(point[1]), float(point[2])
