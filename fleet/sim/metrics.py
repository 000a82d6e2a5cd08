"""What a simulation measured: completion times, queueing delay, utilisation and tenants' shares
over time, resizes and preemptions; a table for people and a dict for ``-o json``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.sim.model import SimConfig, SimJob

#: the times "jobs completed by" is reported at (the paper compares the first 8 hours)
CHECKPOINTS = (
    3600,
    2 * 3600,
    4 * 3600,
    8 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    4 * 86400,
    7 * 86400,
    14 * 86400,
    28 * 86400,
    56 * 86400,
    112 * 86400,
)
#: about this many points in each series over time
POINTS = 120


def human(seconds: float) -> str:
    """3600 -> '1h', 90 -> '90s', 86400 * 2 -> '2d'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass
class Stats:
    mean: float | None = None
    median: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        if not values:
            return cls()
        ordered = sorted(values)
        n = len(ordered)
        return cls(sum(ordered) / n, _rank(ordered, 0.5), _rank(ordered, 0.99), ordered[-1])


def _rank(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile (the median of an even count: the mean of the middle two)."""
    n = len(ordered)
    if q == 0.5 and n % 2 == 0:
        return (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return ordered[min(max(math.ceil(q * n) - 1, 0), n - 1)]


@dataclass
class SimResult:
    policy: str
    gpus: int
    nodes: int
    jobs: int
    completed: int
    #: jobs that never started (still waiting when the clock stopped)
    never_started: int
    #: seconds from arrival to completion, of the jobs that completed
    jct: Stats
    #: seconds from arrival to first start, of the jobs that started
    queueing: Stats
    #: when the last job completed (seconds from the trace's start); None if none did
    makespan: float | None
    #: jobs completed by each checkpoint ("8h": 140)
    completed_by: dict[str, int]
    #: GPU-seconds used / GPU-seconds available, from the first arrival to the clock's end
    utilisation: float
    #: each tenant's part of the GPU-time used (over a whole run, what its jobs asked for)
    tenant_share: dict[str, float]
    #: while jobs waited for GPUs (``contended_s`` seconds): each tenant's part of the GPU-time
    #: used, and its part had every moment been shared by weighted fair share (``fair_gpus``: its
    #: guarantee, then the rest by weight, none beyond what it held and waited for)
    contended_share: dict[str, float]
    fair_share: dict[str, float]
    contended_s: float
    tenant_gpu_hours: dict[str, float]
    resizes: int
    preemptions: int
    #: when the clock stopped
    end: float
    #: series over time: t (bin starts, seconds), utilisation, queued (jobs waiting), and per tenant
    #: the fraction of the fleet's GPUs it held
    series: dict[str, Any] = field(default_factory=dict)
    #: rigid profile jobs whose requested batch was outside the measured range (ran at the best one)
    fallbacks: int = 0
    wall_s: float = 0.0
    trace: str = ""
    load: float = 1.0
    #: the load kept for the trace's whole span (the trace repeated), not only compressed
    sustained: bool = False
    #: each completed job's completion time and when it completed (for plots; not in ``to_dict``)
    jct_values: list[float] = field(default_factory=list, repr=False)
    jct_ends: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["jct_values"], out["jct_ends"]
        return out

    def summary(self) -> list[tuple[str, str]]:
        """(label, value) rows for the table ``fleet sim`` prints."""

        def dur(s: float | None) -> str:
            return "-" if s is None else f"{s:,.0f} s ({s / 3600:.2f} h)"

        by = ", ".join(f"{k}: {v}" for k, v in self.completed_by.items())
        shares = sorted(self.tenant_share.items(), key=lambda kv: -kv[1])
        top = ", ".join(f"{t} {s:.1%}" for t, s in shares[:6]) + (" ..." if len(shares) > 6 else "")
        return [
            (
                "policy",
                f"{self.policy} on {self.gpus} GPUs ({self.nodes} nodes), load x{self.load:g}"
                f"{' sustained' if self.sustained else ''}",
            ),
            ("jobs", f"{self.jobs}: {self.completed} completed, {self.never_started} never started"),
            (
                "JCT avg / median / p99",
                " / ".join(dur(x) for x in (self.jct.mean, self.jct.median, self.jct.p99)),
            ),
            (
                "queueing avg / median / p99",
                " / ".join(dur(x) for x in (self.queueing.mean, self.queueing.median, self.queueing.p99)),
            ),
            ("makespan", dur(self.makespan)),
            ("completed by", by or "-"),
            ("GPU utilisation", f"{self.utilisation:.1%}"),
            ("tenants' GPU-time", top or "-"),
            ("resizes / preemptions", f"{self.resizes} / {self.preemptions}"),
            ("simulated in", f"{self.wall_s:.2f} s"),
        ]


class Recorder:
    """Integrates GPUs held per tenant and jobs waiting over time into bins."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.width = 60.0
        self.held: list[dict[str, float]] = []
        self.queued: list[float] = []
        self.first = 0.0
        #: while jobs waited for GPUs: how long, the GPU-seconds each tenant held, and those weighted
        #: fair share would have given it (given what it held and waited for)
        self.contended_s = 0.0
        self.held_gpu_s: dict[str, float] = {}
        self.fair_gpu_s: dict[str, float] = {}

    def start(self, horizon: float) -> None:
        """``horizon``: the last arrival; bins are sized for about POINTS of them up to there."""
        self.width = max(60.0, math.ceil(horizon / POINTS / 60.0) * 60.0)

    def span(self, t0: float, t1: float, held: Mapping[str, int], queued: int) -> None:
        """From t0 to t1 each tenant held ``held`` GPUs and ``queued`` jobs waited."""
        t = t0
        while t < t1:
            i = int(t // self.width)
            edge = min((i + 1) * self.width, t1)
            while len(self.held) <= i:
                self.held.append({})
                self.queued.append(0.0)
            dt = edge - t
            bucket = self.held[i]
            for tenant, gpus in held.items():
                if gpus:
                    bucket[tenant] = bucket.get(tenant, 0.0) + gpus * dt
            self.queued[i] += queued * dt
            t = edge

    def contended(self, dt: float, held: Mapping[str, int], fair: Mapping[str, float]) -> None:
        """For ``dt`` seconds jobs waited for GPUs: what each tenant held, and what weighted fair
        share would have given it."""
        self.contended_s += dt
        for tenant, used in held.items():
            self.held_gpu_s[tenant] = self.held_gpu_s.get(tenant, 0.0) + used * dt
        for tenant, share in fair.items():
            self.fair_gpu_s[tenant] = self.fair_gpu_s.get(tenant, 0.0) + share * dt

    def result(self, cfg: SimConfig, jobs: list[SimJob], end: float, fallbacks: int) -> SimResult:
        done = [j for j in jobs if j.ended is not None]
        jct = [j.ended - j.trace.arrival for j in done if j.ended is not None]
        waits = [j.started - j.trace.arrival for j in jobs if j.started is not None]
        ends = sorted(j.ended for j in done if j.ended is not None)
        makespan = ends[-1] if ends else None
        completed_by: dict[str, int] = {}
        for mark in CHECKPOINTS:
            completed_by[human(mark)] = sum(1 for e in ends if e <= mark)
            if mark >= end:
                break
        totals: dict[str, float] = {}
        for bucket in self.held:
            for tenant, gs in bucket.items():
                totals[tenant] = totals.get(tenant, 0.0) + gs
        used = sum(totals.values())
        start = min((j.trace.arrival for j in jobs), default=0.0)
        span = max(end - start, 1e-9)
        return SimResult(
            policy=cfg.policy,
            gpus=cfg.gpus,
            nodes=cfg.node_count,
            jobs=len(jobs),
            completed=len(done),
            never_started=sum(1 for j in jobs if j.started is None),
            jct=Stats.of(jct),
            queueing=Stats.of(waits),
            makespan=makespan,
            completed_by=completed_by,
            utilisation=used / (cfg.gpus * span),
            tenant_share={t: v / used for t, v in sorted(totals.items())} if used else {},
            contended_share=_shares(self.held_gpu_s),
            fair_share=_shares(self.fair_gpu_s),
            contended_s=self.contended_s,
            tenant_gpu_hours={t: round(v / 3600, 3) for t, v in sorted(totals.items())},
            resizes=sum(j.resizes for j in jobs),
            preemptions=sum(j.preemptions for j in jobs),
            end=end,
            series=self.series(end, sorted(totals)),
            fallbacks=fallbacks,
            jct_values=jct,
            jct_ends=ends,
        )

    def series(self, end: float, tenants: list[str]) -> dict[str, Any]:
        n = len(self.held)
        widths = [min(self.width, max(end - i * self.width, 0.0)) or self.width for i in range(n)]
        capacity = [self.gpus * w for w in widths]
        return {
            "t": [i * self.width for i in range(n)],
            "bin_s": self.width,
            "utilisation": [round(sum(b.values()) / c, 4) for b, c in zip(self.held, capacity, strict=True)],
            "queued": [round(q / w, 2) for q, w in zip(self.queued, widths, strict=True)],
            "tenants": {
                t: [round(b.get(t, 0.0) / c, 4) for b, c in zip(self.held, capacity, strict=True)]
                for t in tenants
            },
        }


def _shares(gpu_s: Mapping[str, float]) -> dict[str, float]:
    total = sum(gpu_s.values())
    return {t: v / total for t, v in sorted(gpu_s.items())} if total else {}
