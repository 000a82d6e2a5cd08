"""The benchmark that decides: fleet's elastic policy inside Pollux's own simulator.

Pollux's OSDI'21 artifact (``bench/pollux_sim``, vendored: see its README.md) simulates a cluster of
16 nodes x 4 GPUs running a workload of 160 jobs (six real models, arrivals from Microsoft's Philly
trace) at each model's measured throughput *and* statistical efficiency: a job progresses at its
goodput, so a batch larger than its gradient noise scale buys little. This runs fleet's elastic
step (``fleet.scheduler.resizing.decide``, the function the controller's pass calls) as one more
policy in that simulator, beside the artifact's Tiresias and Optimus+Oracle, and prints avg JCT,
p99 JCT, makespan and restarts per policy. Pollux itself needs pymoo 0.4 and numpy < 1.24 (not
installable on the Python fleet supports), so its row is the artifact's published result,
labelled as such (``--published`` shows the others' published results too).

The adapter gives fleet only what a live fleet controller would know of each job: the ranges a user
would submit (GPUs, global batch, the per-GPU batch that fits), the samples/s it measured at each
size it ran at (``fw.report``: a ``learn`` profile; ``--profile bundled`` names the bundled
measured profile instead, as a user may), its last reported gradient noise scale, and its attained
service. Never the future: not its arrival, its total work or what is left of it. Each job is made
a stored :class:`fleet.models.Job` and turned into the step's input by ``Elastic.of``, as live, so a
policy that reads more of a job's reports picks them up here without a change to this file.

    python -m bench.pollux --workloads 1,6 --load 1x --policies fleet,tiresias,pollux

Every run is deterministic; a full workload takes minutes of one core per policy.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas

from bench.pollux_sim.simulator import Cluster, Job, OptimusPolicy, TiresiasPolicy
from fleet.config_sections import ControllerSettings
from fleet.models import Job as StoredJob
from fleet.models import JobSpec, JobState, Range
from fleet.scheduler.capacity import even_split
from fleet.scheduler.profiles import Profile, named_profile
from fleet.scheduler.resizing import Elastic, decide, smaller_growth, smaller_sizes
from fleet.state.profiles import learned

SIM = Path(__file__).parent / "pollux_sim"
#: the artifact's cluster: 16 nodes of 4 GPUs, a scheduling round a minute, 30 s per restart
NODES, PER_NODE, INTERVAL_S, RESTART_S = 16, 4, 60, 30.0
#: the policies: those simulated here, and Pollux's published result
POLICIES = ("fleet", "tiresias", "optimus", "pollux")
LOADS = {"1x": ("workloads", "1.0"), "2x": ("workloads-2.0", "2.0")}
#: the controller's settings as shipped (the elastic step's minimum interval and attained-service weight)
SETTINGS = ControllerSettings()
#: a run gives up past this much simulated time (a policy that never finishes a job)
GIVE_UP_S = 14 * 24 * 3600


@dataclasses.dataclass(frozen=True)
class Known:
    """What a live scheduler knows of one job (all the adapter hands fleet's policy)."""

    name: str
    app: str
    submitted: float
    min_gpus: int
    max_gpus: int
    min_batch: int
    max_batch: int
    #: the per-GPU batch that fits a GPU (``max_batch_per_gpu``)
    max_local: int
    fixed_batch: bool
    gpus: int
    batch: int
    #: when it last started at its size (a restart after a resize counts)
    changed_at: float
    #: samples/s it measured at each (GPUs, global batch) it ran at
    measured: Mapping[tuple[int, int], float]
    #: its gradient noise scale in samples, as last reported (0.0: none yet)
    noise_scale: float
    #: GPU-seconds it has held so far
    attained_gpu_s: float
    #: how many times it restarted at a new size since it first started (``Job.resizes`` live)
    restarts: int = 0


@dataclasses.dataclass
class Spent:
    """Where a simulated job's time went: queued, restarting, progressing (and its GPUs and its
    batch's statistical efficiency while progressing, as sums over those seconds)."""

    waiting: float = 0.0
    restarting: float = 0.0
    running: float = 0.0
    gpu_s: float = 0.0
    worth: float = 0.0

    def add(self, start: float, end: float, restart_left: float, gpus: int, efficiency: float) -> None:
        if end <= start:
            return
        if not gpus:
            self.waiting += end - start
            return
        restarting = min(max(restart_left, 0.0), end - start)
        self.restarting += restarting
        running = end - start - restarting
        self.running += running
        self.gpu_s += running * gpus
        self.worth += running * efficiency


@dataclasses.dataclass(frozen=True)
class JobStat:
    """One job of a simulated fleet run: its JCT and where its time went (:class:`Spent`)."""

    name: str
    model: str
    jct: float
    restarts: int
    waiting_s: float
    restarting_s: float
    #: mean GPUs and mean statistical efficiency while it made progress
    gpus: float
    efficiency: float


class FleetJob(Job):
    """A simulated job whose global batch is the one fleet chose (not Pollux's own optimizer), and
    which measures its samples/s at each size, as ``fw.report`` does live."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fleet_batch = 0
        self.changed_at = 0.0
        self.measured: dict[tuple[int, int], float] = {}
        self.spent = Spent()

    def update_local_bsz(self, placement: Sequence[int]) -> None:
        app, replicas = self.application, sum(filter(None, placement))
        local = math.ceil(self.fleet_batch / replicas - 1e-8)
        self.accum_steps = math.ceil(local / app.max_local_bsz - 1e-8) - 1
        self.atomic_bsz = math.ceil(local / (self.accum_steps + 1) - 1e-8)
        # the artifact measured no per-GPU batch below min_local_bsz (its simulator has no throughput
        # there): a smaller share of fleet's batch runs at that, as Pollux's own sizes never go below it
        self.atomic_bsz = max(self.atomic_bsz, int(app.min_local_bsz))
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / (replicas * (self.accum_steps + 1))))

    def update_params(self, *args: Any) -> None:
        """Keeps the gradient statistics the job reports; skips fitting Pollux's throughput model
        (``perf_params``), which only Pollux's and Optimus' speedup functions use."""
        self.grad_params = args[-2], args[-1]

    def reallocate(self, placement: Sequence[int]) -> None:
        super().reallocate(placement)
        self.changed_at = self.current_time

    def step(self, seconds: float, interference: float = 0.0) -> None:
        began, restarting, batch = self.current_time, self.rescale_time, self._batch_run()
        was_done = self.completion_time is not None
        super().step(seconds, interference)
        if not was_done:
            start = max(began, float(self.submission_time))
            end = min(began + seconds, self.completion_time or math.inf)
            self.spent.add(start, end, restarting, sum(self.placement), self._efficiency(batch))
        placement = tuple(filter(None, self.placement))
        if placement and self.completion_time is None and self.rescale_time <= 0:
            step_time, sync_time = self.application.get_throughput(placement, self.atomic_bsz)
            seconds_per_step = step_time + (step_time - sync_time) * self.accum_steps
            # keyed by the batch it ran, as ``fw.report(batch_size=...)`` says live: not fleet's when
            # the artifact's smallest per-GPU batch raised it
            samples = self._batch_run()
            self.measured[sum(placement), samples] = float(samples / seconds_per_step)

    def _batch_run(self) -> int:
        return sum(self.placement) * self.atomic_bsz * (self.accum_steps + 1)

    def _efficiency(self, batch: int) -> float:
        """The simulator's statistical efficiency of ``batch`` now: a sample's worth against one at the
        model's initial batch."""
        if not batch:
            return 0.0
        app = self.application
        sqr, var = app.get_grad_stats(batch, min(self.epoch, app.max_epochs - 1))
        scale = batch / app.init_batch_size
        return float((var + sqr) / (var / scale + sqr) / scale)

    def stat(self) -> JobStat:
        spent, end = self.spent, self.completion_time
        return JobStat(
            self.name,
            self.application.name,
            math.nan if end is None else float(end - self.submission_time),
            self.num_restarts or 0,
            spent.waiting,
            spent.restarting,
            spent.gpu_s / spent.running if spent.running else 0.0,
            spent.worth / spent.running if spent.running else 0.0,
        )

    def known(self) -> Known:
        app = self.application
        fixed = app.name == "ncf"  # as the artifact runs ncf under Pollux: 1 GPU, batch 32768
        lo, hi = (32768, 32768) if fixed else (int(app.init_batch_size), int(app.max_batch_size))
        most = 1 if fixed else min(NODES * PER_NODE, hi // int(app.min_local_bsz))
        sqr_var = self.grad_params
        noise = 0.0
        if sqr_var is not None and sqr_var[0] > 0:
            noise = float(app.init_batch_size * sqr_var[1] / sqr_var[0])
        return Known(
            name=self.name,
            app=app.name,
            submitted=float(self.submission_time),
            min_gpus=1,
            max_gpus=most,
            min_batch=lo,
            max_batch=hi,
            max_local=int(app.max_local_bsz),
            fixed_batch=fixed,
            gpus=sum(self.placement),
            batch=self.fleet_batch,
            changed_at=self.changed_at,
            measured=dict(self.measured),
            noise_scale=noise,
            attained_gpu_s=float(self.attained_service),
            restarts=self.num_restarts or 0,
        )


def stored(known: Known) -> StoredJob:
    """``known`` as the controller reads a job from Redis."""
    batch: int | Range = (
        known.min_batch if known.fixed_batch else Range(min=known.min_batch, max=known.max_batch)
    )
    spec = JobSpec(
        name=known.app,
        command=["train"],
        gpus=Range(min=known.min_gpus, max=known.max_gpus),
        batch_size=batch,
        profile="learn",
        max_batch_per_gpu=known.max_local,
    )
    running = known.gpus > 0
    return StoredJob(
        id=known.name,
        spec=spec,
        state=JobState.RUNNING if running else JobState.QUEUED,
        created_at=known.submitted,
        started_at=known.changed_at if running else None,
        sized_at=known.changed_at if running else 0.0,
        num_gpus=known.gpus,
        batch_size=known.batch if running else 0,
        speeds={f"{g}x{b}": rate for (g, b), rate in known.measured.items()},
        noise_scale=known.noise_scale,
        used_gpu_s=known.attained_gpu_s,
        resizes=known.restarts,
    )


class FleetPolicy:
    """fleet's elastic step as a policy of the artifact's simulator: ``optimize`` has the signature
    of the artifact's policies; ``on_batch(job, batch, restart)`` is told each placed job's global
    batch, and whether it restarts on the GPUs it holds (placed where it was at a new batch; a change
    of its batch alone the step makes in place, without a restart)."""

    def __init__(self, now: Callable[[], float], profile: str = "learn") -> None:
        self.now, self.profile = now, profile
        self.on_batch: Callable[[str, int, bool], None] = lambda name, batch, restart: None

    def _profile(self, job: StoredJob, known: Known) -> Profile:
        if self.profile == "bundled":
            return named_profile(known.app)
        return learned(job.spec, job.measured)

    def elastic(self, known: Known) -> Elastic:
        """A job as the step sees it: a running one follows a change of its batch alone where it runs
        (as the artifact's AdaptDL jobs do, and a job of ``fw.batch_size(follow=True)``)."""
        job = stored(known)
        step = Elastic.of(job, self._profile(job, known), self.now())
        return dataclasses.replace(step, follows_batch=step.running)

    def optimize(
        self, jobs: Mapping[str, Known], nodes: Mapping[int, Any], prev: Mapping[str, list[int]], _: Any
    ) -> tuple[dict[str, list[int]], int]:
        now = self.now()
        # queue order, as the controller's: running first, then by arrival
        order = sorted(jobs.values(), key=lambda k: (k.gpus == 0, k.submitted, k.name))
        steps = [self.elastic(k) for k in order]
        total = sum(int(n.resources["nvidia.com/gpu"]) for n in nodes.values())
        resizes = decide(
            steps,
            total,
            now,
            resize_cost_s=RESTART_S,
            min_interval_s=SETTINGS.elastic_min_interval_s,
            gpus_per_node=PER_NODE,
            service_s=SETTINGS.elastic_service_s,
        )
        changes = {r.job_id: r.new for r in resizes}
        # a running job whose batch alone changes takes it up where it runs (in place: no restart)
        same = {r.job_id for r in resizes if r.in_place}
        kept = {
            k.name: list(prev[k.name])
            for k in order
            if (k.name not in changes or k.name in same) and prev.get(k.name)
        }
        free = collections.Counter({i: int(n.resources["nvidia.com/gpu"]) for i, n in nodes.items()})
        free.subtract(collections.Counter(i for alloc in kept.values() for i in alloc))
        out = dict(kept)

        def grows(step: Elastic) -> bool:
            return step.running and step.id in changes and changes[step.id].gpus > step.size.gpus

        # as the controller's pass: those that shrink, start or keep their GPU count placed first,
        # then the growing ones, each as large as fits above the size it runs at, else left where it
        # is (passes._fit_growth) if nothing placed before took its GPUs
        for step in [s for s in steps if not grows(s)] + [s for s in steps if grows(s)]:
            size = changes.get(step.id)
            if step.id in same and size is not None:
                self.on_batch(step.id, size.batch, False)
                continue
            if size is None or not size.gpus:
                continue
            # what the controller's pass does with a size that does not fit now: a smaller one that
            # does (passes._fit_misfits), else the job waits
            mine = collections.Counter(prev.get(step.id, []))
            stays = grows(step) and all(free[n] >= k for n, k in mine.items())
            if stays:
                smaller = smaller_growth(
                    step, size.gpus, now, resize_cost_s=RESTART_S, gpus_per_node=PER_NODE
                )
            else:
                smaller = smaller_sizes(step, size.gpus, PER_NODE)
            for choice in [size, *smaller]:
                alloc = place(choice.gpus, free)
                if alloc is not None:
                    out[step.id] = alloc
                    # placed where it was: the simulator sees no change, but a new batch restarts it
                    self.on_batch(step.id, choice.batch, alloc == prev.get(step.id))
                    break
            else:
                if stays:  # no growth fits: it keeps its GPUs
                    free.subtract(mine)
                    out[step.id] = list(prev[step.id])
        return out, len(nodes)


def place(gpus: int, free: collections.Counter[int]) -> list[int] | None:
    """Node index per GPU for a job of ``gpus`` GPUs as fleet places it (one node when it fits, else
    equal members each on its own node, best fit first), taken from ``free``; None when it does not
    fit."""
    members, per = even_split(gpus, PER_NODE)
    fits = sorted((n for n, left in free.items() if left >= per), key=lambda n: (free[n], n))
    if len(fits) < members:
        return None
    chosen = sorted(fits[:members])
    for n in chosen:
        free[n] -= per
    return [n for n in chosen for _ in range(per)]


class FleetCluster(Cluster):
    """The artifact's cluster with fleet's policy: its jobs adapt their batch as fleet says."""

    def __init__(self, workload: pandas.DataFrame, policy: FleetPolicy) -> None:
        super().__init__(workload, policy, NODES, num_gpus=PER_NODE)
        self.jobs = [
            FleetJob(row.name, _application(row.application), row.time) for row in workload.itertuples()
        ]
        self.by_name = {job.name: job for job in self.jobs}
        policy.on_batch = self._batch

    def _batch(self, name: str, batch: int, restart: bool) -> None:
        job = self.by_name[name]
        if batch == job.fleet_batch:
            return
        job.fleet_batch = batch
        if restart and job.placement:
            job.reallocate(job.placement)  # a restart on the same GPUs, with the new batch

    def get_job_infos(self) -> dict[str, Known]:
        return {
            job.name: job.known()
            for job in self.jobs
            if self.current_time >= job.submission_time and job.completion_time is None
        }


def _application(name: str) -> Any:
    from bench.pollux_sim.applications import APPLICATIONS

    return APPLICATIONS[name]


@dataclasses.dataclass(frozen=True)
class Result:
    workload: int
    policy: str
    source: str  # "simulated" | "published"
    jobs: int
    done: int
    avg_jct: float
    p99_jct: float
    makespan: float
    restarts: int | None
    wall_s: float = 0.0
    #: each job's JCT and where its time went (fleet's simulated runs only)
    stats: tuple[JobStat, ...] = ()


def _summary(
    workload: int,
    policy: str,
    source: str,
    jcts: Sequence[float],
    ends: Sequence[float],
    jobs: int,
    restarts: int | None,
    wall_s: float = 0.0,
) -> Result:
    values = np.asarray(jcts, dtype=float)
    return Result(
        workload,
        policy,
        source,
        jobs,
        len(values),
        float(values.mean()) if len(values) else math.nan,
        float(np.percentile(values, 99)) if len(values) else math.nan,
        float(max(ends, default=math.nan)),
        restarts,
        wall_s,
    )


def read_workload(number: int, load: str, limit: int | None = None) -> pandas.DataFrame:
    folder, _ = LOADS[load]
    frame = pandas.read_csv(SIM / folder / f"workload-{number}.csv")
    return frame.head(limit) if limit else frame


def simulate(workload: pandas.DataFrame, policy: str, profile: str = "learn", number: int = 0) -> Result:
    """One policy on one workload (the artifact's format: ``name,time,application,num_replicas,
    batch_size``, the last two what Tiresias and Optimus run at) in the artifact's simulator."""
    clock: list[Cluster] = []
    started = time.monotonic()
    if policy == "fleet":
        fleet = FleetPolicy(lambda: clock[0].current_time, profile)
        cluster: Cluster = FleetCluster(workload, fleet)
    elif policy == "tiresias":
        cluster = Cluster(workload, TiresiasPolicy(lambda: clock[0].current_time), NODES, num_gpus=PER_NODE)
    elif policy == "optimus":
        cluster = Cluster(workload, OptimusPolicy(), NODES, num_gpus=PER_NODE)
    else:
        raise ValueError(f"policy {policy!r}: simulated are fleet, tiresias and optimus")
    clock.append(cluster)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the artifact prints a lot
        while not cluster.all_complete() and cluster.current_time < GIVE_UP_S:
            cluster.step(INTERVAL_S)
    done = [j for j in cluster.jobs if j.completion_time is not None]
    result = _summary(
        number,
        policy,
        "simulated",
        [j.completion_time - j.submission_time for j in done],
        [j.completion_time for j in done],
        len(cluster.jobs),
        sum(j.num_restarts or 0 for j in cluster.jobs),
        time.monotonic() - started,
    )
    stats = tuple(j.stat() for j in cluster.jobs if isinstance(j, FleetJob))
    return dataclasses.replace(result, stats=stats)


def published(number: int, load: str, policy: str) -> Result:
    """The artifact's published result (``results-jobload``: the authors' runs) for one workload."""
    jcts = published_jcts(number, load, policy)
    submitted = dict(zip(*read_workload(number, load)[["name", "time"]].T.values, strict=True))
    ends = [submitted[name] + jct for name, jct in jcts.items()]
    return _summary(number, policy, "published", list(jcts.values()), ends, len(submitted), None)


def _one(args: tuple[int, str, str, bool, int | None, str]) -> Result:
    number, load, policy, use_published, limit, profile = args
    if policy == "pollux" or use_published:
        return published(number, load, policy)
    return simulate(read_workload(number, load, limit), policy, profile, number)


def _numbers(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        try:
            out.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--workloads {text!r}: numbers 1-8, e.g. 1-8 or 1,6") from None
    if not out or not all(1 <= n <= 8 for n in out):
        raise argparse.ArgumentTypeError(f"--workloads {text!r}: numbers 1-8, e.g. 1-8 or 1,6")
    return out


def _policies(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    wrong = [p for p in out if p not in POLICIES]
    if wrong or not out:
        raise argparse.ArgumentTypeError(
            f"--policies {text!r}: a comma-separated list of {', '.join(POLICIES)}"
        )
    return out


def table(results: Sequence[Result]) -> str:
    def cell(value: float | int | None, digits: str = ",.0f") -> str:
        return (
            "-"
            if value is None or (isinstance(value, float) and math.isnan(value))
            else format(value, digits)
        )

    lines = [
        "| workload | policy | source | jobs done | avg JCT (s) | p99 JCT (s) | makespan (s) | restarts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.workload} | {r.policy} | {r.source} | {r.done}/{r.jobs} | {cell(r.avg_jct)} | "
            f"{cell(r.p99_jct)} | {cell(r.makespan)} | {cell(r.restarts)} |"
        )
    by_policy: dict[str, list[Result]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    if len({r.workload for r in results}) > 1:
        for policy, rows in by_policy.items():
            restarts = [r.restarts for r in rows]
            total = None if any(x is None for x in restarts) else sum(x for x in restarts if x is not None)
            lines.append(
                f"| mean | {policy} | {rows[0].source} | - | {cell(np.mean([r.avg_jct for r in rows]))} | "
                f"{cell(np.mean([r.p99_jct for r in rows]))} | {cell(np.mean([r.makespan for r in rows]))} | "
                f"{cell(None if total is None else total / len(rows))} |"
            )
    return "\n".join(lines)


def published_jcts(number: int, load: str, policy: str = "pollux") -> dict[str, float]:
    """Each job's JCT in the artifact's published run of ``policy`` on one workload."""
    _, factor = LOADS[load]
    summary = json.loads((SIM / "results" / f"{policy}-{factor}" / "summary.json").read_text())
    return {name: float(jct) for name, jct in summary["jcts"][f"workload-{number}"].items()}


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def by_model(results: Sequence[Result], load: str) -> str:
    """Where fleet's average JCT differs from Pollux's, per workload and model: the model's jobs, their
    average JCT under each, the model's share of the difference in the workload's average (its jobs'
    differences summed over all the workload's jobs), and where fleet's jobs spent their time:
    queued, starting and restarting (30 s each), and while running their mean GPUs and statistical
    efficiency (a sample's worth against one at the model's initial batch)."""
    lines = [
        "| workload | model | jobs | fleet avg JCT (s) | Pollux | share of the gap (s) | restarts a job "
        "| queued a job (s) | restarting a job (s) | GPUs running | efficiency |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.policy != "fleet" or not r.stats:
            continue
        theirs = published_jcts(r.workload, load)
        models: dict[str, list[JobStat]] = {}
        for stat in r.stats:
            models.setdefault(stat.model, []).append(stat)
        gap = {m: sum(s.jct - theirs[s.name] for s in rows) / len(r.stats) for m, rows in models.items()}
        for model in sorted(models, key=lambda m: -abs(gap[m])):
            rows = models[model]
            published_mean = mean([theirs[s.name] for s in rows])
            lines.append(
                _model_row(r.workload, model, rows, mean([s.jct for s in rows]), published_mean, gap[model])
            )
        everyone = mean(list(theirs.values()))
        lines.append(_model_row(r.workload, "all", r.stats, r.avg_jct, everyone, sum(gap.values())))
    return "\n".join(lines)


def _model_row(
    workload: int, model: str, rows: Sequence[JobStat], jct: float, pollux: float, gap: float
) -> str:
    """One row of :func:`by_model`: ``rows``' averages, beside their JCT, Pollux's and their gap."""
    return (
        f"| {workload} | {model} | {len(rows)} | {jct:,.0f} | {pollux:,.0f} | {gap:+,.0f} | "
        f"{mean([s.restarts for s in rows]):.1f} | {mean([s.waiting_s for s in rows]):,.0f} | "
        f"{mean([s.restarting_s for s in rows]):,.0f} | {mean([s.gpus for s in rows]):.1f} | "
        f"{mean([s.efficiency for s in rows]):.2f} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pollux", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=_numbers, default=_numbers("1-8"), help="e.g. 1-8 or 1,6")
    parser.add_argument("--load", choices=sorted(LOADS), default="1x", help="the artifact's job load")
    parser.add_argument("--policies", type=_policies, default=list(POLICIES), help=",".join(POLICIES))
    parser.add_argument(
        "--published", action="store_true", help="the artifact's published results for all but fleet"
    )
    parser.add_argument(
        "--profile",
        choices=("learn", "bundled"),
        default="learn",
        help="fleet's throughput model: learned from each job's reports, or the bundled profile",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="only each workload's first N jobs (a quick run)"
    )
    parser.add_argument("--processes", type=int, default=1, help="runs in parallel (one core each)")
    parser.add_argument(
        "--by-model",
        action="store_true",
        help="also where fleet's JCT differs from Pollux's published one, per workload and model",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.by_model and args.limit:
        parser.error("--by-model compares whole workloads with Pollux's: leave out --limit")
    runs = [
        (n, args.load, p, args.published and p != "fleet", args.limit, args.profile)
        for n in args.workloads
        for p in args.policies
    ]
    if args.processes > 1:
        with multiprocessing.Pool(args.processes) as pool:
            results = pool.map(_one, runs)
    else:
        results = [_one(run) for run in runs]
    print(
        f"Pollux's simulator, {NODES} nodes x {PER_NODE} GPUs, load {args.load}; "
        f"fleet's profile: {args.profile}"
    )
    print(table(results))
    if args.limit:
        print(f"(simulated: each workload's first {args.limit} jobs; published: all of them)")
    if args.by_model:
        print(by_model(results, args.load))
    for r in results:
        if r.source == "simulated":
            print(f"workload {r.workload} {r.policy}: {r.wall_s:.0f} s to simulate")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
