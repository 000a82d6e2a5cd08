"""What a simulation runs: its configuration (``SimConfig``) and each trace job as it is simulated
(``SimJob``: its size, progress and history). The engine moves them; the metrics read them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.models import Tenant
from fleet.scheduler.elastic import COMPLETION, MIN_INTERVAL_S, RESIZE_COST_S
from fleet.scheduler.fairshare import WEEK
from fleet.scheduler.goodput import efficiency
from fleet.scheduler.profiles import Profile
from fleet.scheduler.snapshot import Placement
from fleet.sim.traces import TraceJob

POLICIES = ("fifo", "fair", "elastic-fixed-batch", "elastic")
#: progress models: ``goodput``, a job's samples count at their statistical efficiency at the batch it
#: runs (from its profile's noise scale per epoch, as Pollux's simulator; a profile without one counts
#: every sample), and the elastic policy sizes jobs by goodput; ``throughput``, every sample counts the
#: same whatever the batch (the seed paper's experiment: a larger batch is free)
MODELS = ("goodput", "throughput")
ELASTIC = ("elastic-fixed-batch", "elastic")
#: profiles were measured on nodes of 4 GPUs: the default node size
GPUS_PER_NODE = 4


@dataclass(frozen=True)
class SimConfig:
    policy: str = "fifo"
    gpus: int = 64
    #: nodes the GPUs are spread over (equal); default: nodes of 4 GPUs
    nodes: int | None = None
    #: stop the clock here (seconds); None: when every job has ended or can never start
    until: float | None = None
    resize_cost_s: float = RESIZE_COST_S
    min_interval_s: float = MIN_INTERVAL_S
    #: tenants' policies (weight, guarantee, max) for ``fair``; absent tenants get the default
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    half_life_s: float = WEEK
    #: elastic-fixed-batch: may a job reach its batch on few GPUs by gradient accumulation
    #: (the paper's baseline may not: its per-GPU batch must fit a GPU)
    accumulate: bool = False
    #: elastic jobs' GPU range (max: None = the profile's measured maximum)
    min_gpus: int = 1
    max_gpus: int | None = None
    #: what the elastic policy maximises (``elastic.SPEEDUP`` or ``elastic.COMPLETION``)
    objective: str = COMPLETION
    #: the horizon a resize's cost is spread over (None: the policy's default)
    horizon_s: float | None = None
    #: elastic jobs sized by what they ran at, as ``profile: learn`` live (``LearnedProfile``), not by
    #: the measured profile their throughput comes from: what knowing a job's scaling is worth
    learn: bool = False
    #: learning jobs declare the largest per-GPU batch that fits (``max_batch_per_gpu``: their
    #: profile's largest on one GPU); else they never exceed the largest they ran at
    learn_max_local: bool = True
    #: how jobs progress (:data:`MODELS`)
    model: str = "goodput"
    #: elastic: weigh jobs by attained service (GPU-seconds that halve a job's value; 0: off)
    service_s: float = 0.0

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}: one of {', '.join(POLICIES)}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: one of {', '.join(MODELS)}")
        nodes = self.node_count
        if self.gpus < 1 or nodes < 1 or self.gpus % nodes:
            raise ValueError(f"{self.gpus} GPUs cannot be spread evenly over {nodes} nodes")

    @property
    def node_count(self) -> int:
        return self.nodes if self.nodes is not None else max(self.gpus // GPUS_PER_NODE, 1)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.node_count


@dataclass
class SimJob:
    trace: TraceJob
    seq: int
    profile: Profile | None
    #: samples (a workload job; under the goodput model, samples at its profile's smallest batch) or
    #: seconds (a duration job) to process
    work: float
    elastic: bool
    done: float = 0.0
    rate: float = 0.0
    since: float = 0.0
    #: no progress until then (a resize or restart under way)
    paused_until: float = 0.0
    gpus: int = 0
    batch: int = 0
    members: list[Placement] = field(default_factory=list)
    started: float | None = None
    #: when it last started (for preemption's min_run_s)
    running_since: float | None = None
    ended: float | None = None
    changed_at: float = 0.0
    resizes: int = 0
    preemptions: int = 0
    #: it ran before: its next start restores a checkpoint (costs resize_cost_s)
    restarting: bool = False
    version: int = 0
    #: samples/s at each (GPUs, batch) it ran at (a job reports them live; here, known at once: a
    #: report comes well within the minimum interval before its next resize)
    observed: dict[tuple[int, int], float] = field(default_factory=dict)
    #: GPU-seconds it held GPUs for so far (its attained service)
    attained: float = 0.0

    @property
    def id(self) -> str:
        return self.trace.id

    @property
    def tenant(self) -> str:
        return self.trace.tenant

    def advance(self, now: float) -> None:
        start = max(self.since, self.paused_until)
        if self.rate > 0 and now > self.since:
            self.attained += self.gpus * (now - self.since)
        if self.rate > 0 and now > start:
            self.done = min(self.work, self.done + self.rate * (now - start))
        self.since = now

    def next_epoch_at(self, now: float) -> float:
        """When it starts its next epoch at its rate (inf: never, or its last epoch)."""
        epoch = self.profile.epoch_samples if self.profile is not None else 0
        if epoch <= 0 or self.rate <= 0:
            return math.inf
        ahead = (math.floor(self.done / epoch + 1e-6) + 1) * epoch  # floored past rounding: never now
        return (
            max(now, self.paused_until) + (ahead - self.done) / self.rate if ahead < self.work else math.inf
        )

    def finish_at(self, now: float) -> float:
        if self.rate <= 0:
            return math.inf
        return max(now, self.paused_until) + max(self.work - self.done, 0.0) / self.rate


def largest_local(profile: Profile) -> int:
    """The largest per-GPU batch a model fits on one GPU: what a user would declare."""
    one = profile.placements.get((1,))
    measured = int(one[0][-1]) if one else profile.min_batch
    return min(measured, profile.max_local) if profile.max_local is not None else measured


def noise_scale(config: SimConfig, job: SimJob) -> float | None:
    """The noise scale ``job`` would report now: its profile's in the epoch it is in (goodput model;
    None under the throughput model or without one)."""
    if config.model != "goodput" or job.profile is None:
        return None
    return job.profile.noise_scale(job.done)


def worth(config: SimConfig, job: SimJob) -> float:
    """The statistical efficiency of the samples ``job`` processes now at its batch, relative to its
    profile's smallest batch (1.0 under the throughput model)."""
    noise = noise_scale(config, job)
    if noise is None or job.profile is None or job.batch < 1:
        return 1.0
    return efficiency(job.batch, noise, job.profile.min_batch)


def speed(config: SimConfig, job: SimJob, gpus_per_node: int) -> tuple[float, bool]:
    """Samples/s of ``job`` at its size (1.0: a duration job) and whether it fell back to the best
    batch on its GPUs (a rigid job's batch outside what was measured)."""
    if job.profile is None:
        return 1.0, False
    if job.elastic:
        # sized by goodput, a batch past what fits its GPUs is reached by accumulation
        fixed = config.policy == "elastic-fixed-batch"
        accumulate = config.accumulate if fixed else noise_scale(config, job) is not None
        return job.profile.throughput(job.gpus, job.batch, gpus_per_node, accumulate), False
    # a rigid job runs as asked; Pollux's workloads assume gradient accumulation where the
    # per-GPU batch does not fit (bert at 384 on 12 GPUs)
    rate = job.profile.throughput(job.gpus, job.batch, gpus_per_node, accumulate=True)
    if rate > 0:
        return rate, False
    # outside what was measured: the best batch in range on those GPUs
    return job.profile.best(job.gpus, gpus_per_node=gpus_per_node, accumulate=True)[0], True
