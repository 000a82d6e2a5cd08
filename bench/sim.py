"""The simulator and the elastic policy (issue 11): what BENCHMARKS.md reports, printed as markdown.

    python -m bench.sim                    # everything (about 10 minutes on 2 cores)
    python -m bench.sim allocator          # the optimizer's cost per decision
    python -m bench.sim paper              # workloads 1-4 x load 1, 1.5, 2 x the policies (+ figure)
    python -m bench.sim sustained          # workloads 1-4 at 1.5x, 2x kept for 8 h: fixed-batch vs elastic
    python -m bench.sim learned            # elastic with learned profiles vs measured ones, 2x load
    python -m bench.sim philly             # the whole Philly file on 512 GPUs, fifo and fair
    python -m bench.sim fairness           # weighted tenants over the Philly file: shares vs weights

Every number comes from ``fleet.sim.run`` (what ``fleet sim`` runs) or ``elastic.allocate`` (what
the simulator and the controller call); nothing here needs Redis or a GPU.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path

from fleet.scheduler.elastic import COMPLETION, ElasticJob, allocate
from fleet.scheduler.profiles import named_profile
from fleet.sim import SimResult, read_trace
from fleet.sim import run as simulate_run

FIGURES = Path(__file__).parent / "figures"
POLICIES = ("fifo", "fair", "elastic-fixed-batch", "elastic")
LOADS = (1.0, 1.5, 2.0)
#: the weights of the fairness run: the four largest virtual clusters apart, the rest weight 1
WEIGHTS = {"6214e9": 4.0, "6c71a0": 2.0, "11cb48": 2.0, "b436b2": 1.0}


def run(trace: str | Path, policy: str, **options: object) -> SimResult:
    """``fleet.sim.run`` under the throughput model: the tables here are the seed paper's experiment
    (every sample counts the same at any batch); ``fleet sim --model goodput`` is Pollux's."""
    return simulate_run(trace, policy, model="throughput", **options)  # type: ignore[arg-type]


def _jobs(n: int, seed: int) -> list[ElasticJob]:
    """``n`` elastic jobs drawn from the four workloads (their models and batch ranges)."""
    rng = random.Random(seed)
    pool = [j for w in range(1, 5) for j in read_trace(f"workload-{w}")]
    out = []
    for i in range(n):
        trace = rng.choice(pool)
        assert trace.model is not None
        p = named_profile(trace.model)
        out.append(
            ElasticJob(
                f"j{i}", trace.tenant, 1, 64, p.min_batch, p.max_batch, p, remaining=p.samples * rng.random()
            )
        )
    return out


def _time(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    call()  # warm: profiles' curves are worked out once per process
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), max(times)


def allocator() -> None:
    print("| jobs | GPUs | state | decision: median / max (ms) | jobs running after |")
    print("|---|---|---|---|---|")
    for n, gpus, target in ((160, 64, 100), (40, 64, 100), (1000, 512, 1000), (300, 512, 1000)):
        jobs = _jobs(n, seed=n)
        for objective in ("speedup", COMPLETION):
            plan = allocate(jobs, gpus, 0.0, objective=objective)
            med, worst = _time(lambda: allocate(jobs, gpus, 0.0, objective=objective), 20)  # noqa: B023
            running = sum(1 for g, _ in plan.values() if g)
            ms = f"{med * 1e3:.1f} / {worst * 1e3:.1f}"
            print(f"| {n} | {gpus} | all waiting ({objective}) | {ms} | {running} |")
            # every admitted job running at its size and free to resize: hysteresis on each
            held = [replace(j, gpus=plan[j.id][0], batch=plan[j.id][1], changed_at=0.0) for j in jobs]
            med, worst = _time(lambda: allocate(held, gpus, 1e4, objective=objective), 20)  # noqa: B023
            ms = f"{med * 1e3:.1f} / {worst * 1e3:.1f}"
            print(f"| {n} | {gpus} | {running} running, all resizable ({objective}) | {ms} | {running} |")
        print(f"| (target) | | | <= {target} ms | |")


def _row(r: SimResult) -> str:
    mean = "-" if r.jct.mean is None else f"{r.jct.mean:,.0f}"
    median = "-" if r.jct.median is None else f"{r.jct.median:,.0f}"
    p99 = "-" if r.jct.p99 is None else f"{r.jct.p99:,.0f}"
    wait = "-" if r.queueing.mean is None else f"{r.queueing.mean:,.0f}"
    span = "-" if r.makespan is None else f"{r.makespan / 3600:.1f}"
    by4, by8 = r.completed_by.get("4h", r.completed), r.completed_by.get("8h", r.completed)
    return (
        f"| {r.trace} | {r.load:g} | {r.policy} | {mean} | {median} | {p99} | {wait} | {by4} | {by8} | "
        f"{span} | {r.utilisation:.0%} | {r.resizes} |"
    )


ACCUMULATED, SPEEDUP = "elastic-fixed-batch --accumulate", "elastic --objective speedup"


def paper(figures: Path = FIGURES) -> None:
    results: dict[str, list[SimResult]] = {p: [] for p in POLICIES}
    extra: dict[str, list[SimResult]] = {ACCUMULATED: [], SPEEDUP: []}
    print(
        "| trace | load | policy | JCT avg (s) | median | p99 | queueing avg (s) | done by 4 h | "
        "done by 8 h | makespan (h) | GPU use | resizes |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in range(1, 5):
        for load in LOADS:
            for policy in POLICIES:
                r = run(f"workload-{w}", policy, gpus=64, load=load)
                results[policy].append(r)
                print(_row(r))
            extra[ACCUMULATED].append(run(f"workload-{w}", "elastic-fixed-batch", load=load, accumulate=True))
            extra[SPEEDUP].append(run(f"workload-{w}", "elastic", load=load, objective="speedup"))
    print()
    print(
        "| trace | load | JCT: fixed-batch / elastic | done by 8 h: elastic / fixed-batch | done by 4 h: "
        "elastic / fixed | baseline with accumulation: JCT / elastic's | speedup objective: fixed's JCT / "
        "elastic's |"
    )
    print("|---|---|---|---|---|---|---|")
    pairs = zip(results["elastic-fixed-batch"], results["elastic"], strict=True)
    for i, (fixed, elastic) in enumerate(pairs):
        acc, spd = extra[ACCUMULATED][i], extra[SPEEDUP][i]
        assert fixed.jct.mean and elastic.jct.mean and acc.jct.mean and spd.jct.mean
        by8 = elastic.completed_by.get("8h", 160) / max(fixed.completed_by.get("8h", 160), 1)
        by4 = elastic.completed_by.get("4h", 160) / max(fixed.completed_by.get("4h", 160), 1)
        ratio = fixed.jct.mean / elastic.jct.mean
        print(
            f"| {fixed.trace} | {fixed.load:g} | **{ratio:.2f}x** | {by8:.2f}x | {by4:.2f}x | "
            f"{acc.jct.mean / elastic.jct.mean:.2f}x | {fixed.jct.mean / spd.jct.mean:.2f}x |"
        )
    try:
        from fleet.sim.plot import compare, plot
    except ImportError:
        return
    figures.mkdir(parents=True, exist_ok=True)
    at2 = {p: [r for r in rs if r.load == 2.0] for p, rs in results.items()}
    compare(at2, figures / "sim-workloads-2x.png", "workloads 1-4 at 2x load, 64 GPUs")
    plot(results["elastic"][-1], figures / "sim-elastic-w4-2x.png")
    print(f"\nfigures: {figures / 'sim-workloads-2x.png'}, {figures / 'sim-elastic-w4-2x.png'}")


def sustained(figures: Path = FIGURES) -> None:
    """The load kept for the workloads' whole 8 hours (``--sustain``: 1.5x / 2x their jobs arriving over
    the same 8 h), where "jobs completed within 8 h" can tell policies apart: compressed, every job has
    arrived by 4-5.3 h and the baseline ends 131-152 of 160 by 8 h."""
    print()
    print(
        "| trace | load (sustained) | jobs | done by 8 h: fixed-batch / elastic | ratio | "
        "JCT avg (s): fixed-batch / elastic | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    at2: dict[str, list[SimResult]] = {"elastic-fixed-batch": [], "elastic": []}
    for w in range(1, 5):
        for load in (1.5, 2.0):
            fixed, elastic = (run(f"workload-{w}", p, gpus=64, load=load, sustain=True) for p in at2)
            if load == 2.0:
                at2["elastic-fixed-batch"].append(fixed)
                at2["elastic"].append(elastic)
            f8, e8 = fixed.completed_by.get("8h", 0), elastic.completed_by.get("8h", 0)
            fj, ej = fixed.jct.mean or 0.0, elastic.jct.mean or 1.0
            done, jct = (
                f"{f8} / {e8} | **{e8 / max(f8, 1):.2f}x**",
                f"{fj:,.0f} / {ej:,.0f} | **{fj / ej:.2f}x**",
            )
            print(f"| workload-{w} | {load:g} | {fixed.jobs} | {done} | {jct} |")
    try:
        from fleet.sim.plot import compare
    except ImportError:
        return
    figures.mkdir(parents=True, exist_ok=True)
    compare(
        at2, figures / "sim-workloads-2x-sustained.png", "workloads 1-4 at 2x load sustained for 8 h, 64 GPUs"
    )
    print(f"\nfigure: {figures / 'sim-workloads-2x-sustained.png'}")


def learned() -> None:
    """Elastic jobs sized by what they ran at (``profile: learn``, ``fleet sim --learn``), declaring the
    largest per-GPU batch that fits (``max_batch_per_gpu``) or not, against the same jobs sized by their
    measured profile, and the fixed-batch baseline (measured profile)."""
    print(
        "| trace | load | JCT avg (s): measured | learned, per-GPU max declared | learned, not declared "
        "| fixed-batch | declared vs measured | undeclared vs measured | fixed-batch vs declared |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for w in range(1, 5):
        trace = f"workload-{w}"
        known = run(trace, "elastic", load=2.0)
        declared = run(trace, "elastic", load=2.0, learn=True)
        undeclared = run(trace, "elastic", load=2.0, learn=True, learn_max_local=False)
        fixed = run(trace, "elastic-fixed-batch", load=2.0)
        k, d, u, f = (r.jct.mean or 1.0 for r in (known, declared, undeclared, fixed))
        print(
            f"| {trace} | 2 | {k:,.0f} | {d:,.0f} | {u:,.0f} | {f:,.0f} | {d / k:.2f}x | {u / k:.2f}x | "
            f"**{f / d:.2f}x** |"
        )


def philly() -> None:
    print(
        "| policy | GPUs | jobs | simulated in (s, wall) | CPU (s) | JCT avg / median (h) | "
        "queueing avg (h) | GPU use | makespan (d) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for policy in ("fifo", "fair"):
        cpu = time.process_time()
        r = run("philly", policy, gpus=512)
        cpu = time.process_time() - cpu
        assert r.jct.mean is not None and r.jct.median is not None and r.queueing.mean is not None
        jct = f"{r.jct.mean / 3600:.1f} / {r.jct.median / 3600:.2f}"
        print(
            f"| {policy} | 512 | {r.jobs:,} | {r.wall_s:.0f} | {cpu:.0f} | {jct} | "
            f"{r.queueing.mean / 3600:.1f} | {r.utilisation:.0%} | {(r.makespan or 0) / 86400:.1f} |"
        )


def _backlog(path: Path) -> Path:
    """The Philly jobs of the four weighted teams that are short (<= 1 h, <= 4 GPUs), all submitted
    at the start, in their order: each team has work queued for hours (a long run with short jobs)."""
    with resources.as_file(resources.files("fleet") / "traces" / "philly-sep-oct-2017.csv") as src:
        rows = list(csv.DictReader(src.open(newline="")))
    short = [r for r in rows if float(r["duration"]) <= 3600 and int(r["num_gpus"]) <= 4]
    keep = [r for r in short if r["cluster"] in WEIGHTS]
    first = keep[0]["timestamp"]
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(keep[0]))
        out.writeheader()
        out.writerows({**r, "timestamp": first} for r in keep)
    return path


def _shares(results: dict[str, SimResult]) -> None:
    """Each policy's GPU-time while jobs waited against weighted fair share given demand then."""
    print("| tenant | weight | fair: expected | actual | off by | fifo: expected | actual | off by |")
    print("|---|---|---|---|---|---|---|---|")
    fair = results["fair"].fair_share
    for tenant in sorted(fair, key=lambda t: -fair[t]):
        cells = []
        for policy in ("fair", "fifo"):
            want = results[policy].fair_share.get(tenant, 0.0)
            got = results[policy].contended_share.get(tenant, 0.0)
            cells += [f"{want:.1%}", f"{got:.1%}", f"{(got - want) / want:+.1%}" if want else "-"]
        print(f"| {tenant} | {WEIGHTS.get(tenant, 1):g} | " + " | ".join(cells) + " |")


def fairness(gpus: int = 256) -> None:
    total = sum(WEIGHTS.values())
    print("weights:", ", ".join(f"{t} {w:g} ({w / total:.1%})" for t, w in WEIGHTS.items()), "(others 1)")
    with tempfile.TemporaryDirectory() as tmp:
        trace = _backlog(Path(tmp) / "backlog.csv")
        for until, label in ((12 * 3600, "12 h (every team still has work queued)"), (7 * 86400, "7 days")):
            results = {p: run(trace, p, gpus=64, weights=WEIGHTS, until=until) for p in ("fair", "fifo")}
            print(f"\nShort Philly jobs of four teams, all queued at the start, 64 GPUs, first {label}:\n")
            _shares(results)
    results = {p: run("philly", p, gpus=gpus, weights=WEIGHTS) for p in ("fair", "fifo")}
    print(f"\nThe whole Philly file with its arrivals, {gpus} GPUs:\n")
    _shares(results)
    for policy, r in results.items():
        days, jct = r.contended_s / 86400, (r.jct.mean or 0) / 3600
        print(f"\n{policy}: {r.wall_s:.0f} s, jobs waited during {days:.0f} days, JCT avg {jct:.1f} h")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "parts", nargs="*", choices=["allocator", "paper", "sustained", "learned", "philly", "fairness"]
    )
    parser.add_argument("--figures", type=Path, default=FIGURES)
    args = parser.parse_args()
    parts = args.parts or ["allocator", "paper", "sustained", "learned", "philly", "fairness"]
    for part in parts:
        print(f"\n## {part}\n")
        if part in ("paper", "sustained"):
            (paper if part == "paper" else sustained)(args.figures)
        else:
            {"allocator": allocator, "learned": learned, "philly": philly, "fairness": fairness}[part]()


if __name__ == "__main__":
    main()
