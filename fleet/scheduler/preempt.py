"""Preemption: which running jobs to stop so that a waiting job can start. Pure, no I/O.

Who may preempt, and whom:

- A job whose tenant is below its guarantee, and stays within it once the job runs, may stop jobs
  of tenants holding more GPUs than their fair share (``FairShare.fair_gpus``), as long as the
  victim's tenant stays above its fair share before each stop; a ``preemptible: false`` job only
  when its tenant stays at or above its guarantee without it (the guarantee shields it, nothing
  else does).
- Any job may stop lower-priority preemptible jobs of its own tenant.
- Never a job that is not running yet, that has run less than its tenant's ``min_run_s`` (so it
  checkpoints at least once), or that is already being stopped.

Never for nothing: the victims' GPUs, CPUs and memory are given back on a copy of the nodes and
the waiting job is placed there with the pass's own :class:`Capacity` (a gang all members or none,
its tenant's ``max_gpus`` respected); if even every candidate would not let it start, nobody is
stopped. Among the sets that do, one victim is preferred to several, then lower priority, then the
most recently started (it has the least work since its last checkpoint); victims added on the way
that turn out not to be needed are dropped.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet.scheduler.capacity import Capacity
from fleet.scheduler.fairshare import FairShare
from fleet.scheduler.snapshot import NodeView, PendingJob

#: candidates considered for one waiting job (the lowest-ranked first): bounds a decision's cost
MAX_CANDIDATES = 64


@dataclass(frozen=True)
class RunningJob:
    """A job on nodes, as preemption sees it."""

    id: str
    attempt: int
    tenant: str
    priority: int
    gpus: int
    #: (node, GPU UUIDs) of each member, rank 0 first
    members: tuple[tuple[str, tuple[str, ...]], ...]
    #: CPUs and memory granted per member
    cpus: float = 0.0
    memory: int = 0
    #: when it started running; None while it is still being placed or started
    started_at: float | None = None
    preemptible: bool = True
    #: already asked to stop (drain, cancel, preemption): its GPUs come free anyway
    stopping: bool = False
    #: the waiting job it is being stopped for, or ""
    preempted_for: str = ""

    @property
    def uuids(self) -> frozenset[str]:
        return frozenset(u for _, gpus in self.members for u in gpus)


@dataclass(frozen=True)
class Preemption:
    """Stop ``victims`` so that the waiting ``job`` starts on what they free (``gpus``); ``reasons``:
    each victim's history entry."""

    job: PendingJob
    victims: tuple[RunningJob, ...]
    reasons: Mapping[str, str]
    gpus: frozenset[str]


def preemptions(
    blocked: Sequence[PendingJob],
    running: Sequence[RunningJob],
    nodes: Sequence[NodeView],
    fair: FairShare,
    demand: Mapping[str, int],
    now: float,
) -> list[Preemption]:
    """The preemptions for the waiting jobs ``blocked`` (in the order the pass tried them; each
    found no room), given the jobs ``running``; ``demand``: each tenant's GPUs held plus queued.
    ``fair`` is updated as if each preemption had happened, so later ones account for earlier."""
    shares = fair.fair_gpus(demand)
    free = [r for r in running if not r.stopping]
    out = []
    for job in blocked:
        found = _for(job, free, nodes, fair, shares, now)
        if found is None:
            continue
        out.append(found)
        gone = {v.id for v in found.victims}
        free = [r for r in free if r.id not in gone]
        for v in found.victims:
            fair.without(v.tenant, v.gpus, v.cpus * len(v.members), v.memory * len(v.members))
        fair.add(job)
    return out


def _for(
    job: PendingJob,
    running: Sequence[RunningJob],
    nodes: Sequence[NodeView],
    fair: FairShare,
    shares: Mapping[str, float],
    now: float,
) -> Preemption | None:
    policy = fair.policy(job.tenant)
    below = job.gpus > 0 and fair.holds(job.tenant).gpus + job.gpus <= policy.guaranteed_gpus
    prefix = f"preempted for job {job.id} of tenant {job.tenant}"
    plural = "s" if policy.guaranteed_gpus != 1 else ""
    reasons: dict[str, str] = {}
    for r in running:
        if r.started_at is None or now - r.started_at < fair.policy(r.tenant).min_run_s:
            continue
        if r.tenant == job.tenant and r.priority < job.priority and r.preemptible:
            reasons[r.id] = f"{prefix} (priority {job.priority} over {r.priority})"
        elif r.tenant != job.tenant and below and fair.holds(r.tenant).gpus > shares.get(r.tenant, 0.0):
            reasons[r.id] = f"{prefix} (below its guarantee of {policy.guaranteed_gpus} GPU{plural})"
    ranked = sorted((r for r in running if r.id in reasons), key=_rank)[:MAX_CANDIDATES]
    victims = _choose(job, ranked, nodes, fair, shares)
    if victims is None:
        return None
    gpus = frozenset(u for v in victims for u in v.uuids)
    return Preemption(job, tuple(victims), {v.id: reasons[v.id] for v in victims}, gpus)


def _rank(r: RunningJob) -> tuple[int, float, str]:
    """Lowest priority first, then the most recently started."""
    return (r.priority, -(r.started_at or 0.0), r.id)


def _choose(
    job: PendingJob,
    ranked: list[RunningJob],
    nodes: Sequence[NodeView],
    fair: FairShare,
    shares: Mapping[str, float],
) -> list[RunningJob] | None:
    if not ranked or not _fits(job, ranked, nodes, fair):
        return None  # even all of them would not let it start: stop nobody
    for r in ranked:
        if _allowed(job, [r], fair, shares) and _fits(job, [r], nodes, fair):
            return [r]
    chosen: list[RunningJob] = []
    for r in ranked:
        if _allowed(job, [*chosen, r], fair, shares):
            chosen.append(r)
            if _fits(job, chosen, nodes, fair):
                break
    else:
        return None
    for r in reversed(list(chosen)):  # drop what turned out not to be needed, the best-kept last
        rest = [c for c in chosen if c is not r]
        if rest and _fits(job, rest, nodes, fair):
            chosen = rest
    return chosen


def _allowed(
    job: PendingJob, victims: list[RunningJob], fair: FairShare, shares: Mapping[str, float]
) -> bool:
    """Each victim of another tenant is stopped while its tenant still holds more than its fair
    share, and a non-preemptible one only if its tenant keeps its guarantee without it."""
    left: dict[str, int] = {}
    for v in victims:
        if v.tenant == job.tenant:
            continue
        held = left.get(v.tenant, fair.holds(v.tenant).gpus)
        if held <= shares.get(v.tenant, 0.0):
            return False
        if not v.preemptible and held - v.gpus < fair.policy(v.tenant).guaranteed_gpus:
            return False
        left[v.tenant] = held - v.gpus
    return True


def _fits(job: PendingJob, victims: list[RunningJob], nodes: Sequence[NodeView], fair: FairShare) -> bool:
    """Would ``job`` start on the nodes with ``victims`` gone (and stay within its tenant's max)?"""
    own = [v for v in victims if v.tenant == job.tenant]
    if own:  # its own victims' share of its limits comes back first
        fair = copy.deepcopy(fair)
        for v in own:
            fair.without(v.tenant, v.gpus, v.cpus * len(v.members), v.memory * len(v.members))
    if fair.limit(job):
        return False
    return Capacity(without(nodes, victims)).place(job) is not None


def without(nodes: Sequence[NodeView], victims: list[RunningJob]) -> list[NodeView]:
    freed = {u for v in victims for u in v.uuids}
    cpus: dict[str, float] = {}
    memory: dict[str, int] = {}
    for v in victims:
        for node, _ in v.members:
            cpus[node] = cpus.get(node, 0.0) + v.cpus
            memory[node] = memory.get(node, 0) + v.memory
    out = []
    for n in nodes:
        if n.name not in cpus:
            out.append(n)
            continue
        gpus = tuple(
            dataclasses.replace(g, free=g.healthy, holder="") if g.uuid in freed else g for g in n.gpus
        )
        out.append(
            dataclasses.replace(
                n, gpus=gpus, used_cpus=n.used_cpus - cpus[n.name], used_memory=n.used_memory - memory[n.name]
            )
        )
    return out
