"""Fair share between tenants: whose job a pass places next, and what each tenant's share is.

Order of service (``FairShare.key``, lowest first):

1. A tenant below a guarantee (GPUs, CPUs or memory), the furthest below (held / guaranteed, of the
   resource it is furthest below) first.
2. Every other tenant by how far it is above its guarantee, divided by its weight. "How far" blends
   two dominant-resource shares of the fleet, half each: what it holds now (the largest of its
   fractions of the fleet's GPUs, CPUs and memory, where those are scheduled), and what it used
   lately (its decayed GPU-seconds as a fraction of what holding every GPU through the decay window
   would give). The current half makes each placement count at once within a pass; the past half
   lets a tenant that has waited catch up on one that had the fleet to itself, and makes GPU-time
   shares converge to the weights even with short jobs. A tenant holding a steady fraction of the
   fleet has both halves equal, so the blend only matters when use changes.

A tenant never holds more than its ``max_gpus`` (``limit``). Past use only orders the queue:
preemption compares what a tenant holds now with its fair share in GPUs (``fair_gpus``), so nobody
is preempted for what they ran last week.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from fleet.models import Tenant
from fleet.scheduler.snapshot import NodeView, PendingJob
from fleet.scheduler.usage import window

WEEK = 7 * 86400.0
#: the weight of past use against current holdings in a tenant's share (see the module doc)
PAST = 0.5


@dataclass(frozen=True)
class Use:
    """What a tenant holds (or the fleet has): GPUs, CPUs, memory bytes, and how many jobs."""

    gpus: int = 0
    cpus: float = 0.0
    memory: int = 0
    jobs: int = 0

    def plus(self, gpus: int, cpus: float, memory: int, jobs: int = 1) -> Use:
        return Use(self.gpus + gpus, self.cpus + cpus, self.memory + memory, self.jobs + jobs)


def fleet_size(nodes: Iterable[NodeView]) -> Use:
    """What fair shares are fractions of: the healthy GPUs, CPUs and memory of schedulable nodes,
    and of others only what jobs hold there (it comes back to the pool when they end)."""
    gpus, cpus, memory = 0, 0.0, 0
    for n in nodes:
        if n.schedulable:
            gpus, cpus, memory = gpus + sum(g.healthy for g in n.gpus), cpus + n.cpus, memory + n.memory
        else:
            gpus += sum(1 for g in n.gpus if g.holder)
            cpus, memory = cpus + n.used_cpus, memory + n.used_memory
    return Use(gpus, cpus, memory, 0)


class FairShare:
    """The tenants as one pass sees them; ``add`` what the pass places so the order follows."""

    def __init__(
        self,
        policies: Mapping[str, Tenant] | None = None,
        held: Mapping[str, Use] | None = None,
        usage: Mapping[str, float] | None = None,
        fleet: Use = Use(),
        half_life: float = WEEK,
    ) -> None:
        self.policies = dict(policies or {})
        self.held = dict(held or {})
        self.usage = dict(usage or {})
        self.fleet, self.half_life = fleet, half_life

    def policy(self, tenant: str) -> Tenant:
        found = self.policies.get(tenant)
        if found is None:
            found = self.policies[tenant] = Tenant(name=tenant)
        return found

    def holds(self, tenant: str) -> Use:
        return self.held.get(tenant, Use())

    def key(self, tenant: str) -> tuple[int, float, str]:
        """Lower first: below-guarantee tenants (furthest below first), then by weighted share."""
        below = self.below(tenant)
        if below is not None:
            return (0, below, tenant)
        return (1, self.share(tenant) / self.policy(tenant).weight, tenant)

    def below(self, tenant: str) -> float | None:
        """Held / guaranteed of the resource the tenant is furthest below its guarantee of, or None
        when it holds every guarantee it has."""
        policy, held = self.policy(tenant), self.holds(tenant)
        parts = [
            have / owed
            for have, owed in (
                (held.gpus, policy.guaranteed_gpus),
                (held.cpus, policy.guaranteed_cpus),
                (held.memory, policy.guaranteed_memory or 0),
            )
            if have < owed
        ]
        return min(parts, default=None)

    def share(self, tenant: str) -> float:
        """The blended dominant share above the tenant's guarantee (see the module doc)."""
        held, fleet = self.holds(tenant), self.fleet
        now = max(
            _part(held.gpus, fleet.gpus), _part(held.cpus, fleet.cpus), _part(held.memory, fleet.memory)
        )
        past = _part(self.usage.get(tenant, 0.0), fleet.gpus * window(self.half_life))
        policy = self.policy(tenant)
        guaranteed = max(
            _part(policy.guaranteed_gpus, fleet.gpus),
            _part(policy.guaranteed_cpus, fleet.cpus),
            _part(policy.guaranteed_memory or 0, fleet.memory),
        )
        return max(0.0, (1 - PAST) * now + PAST * past - guaranteed)

    def limit(self, job: PendingJob, members: int | None = None) -> str:
        """Why ``job`` may not start now because of its tenant's ``max_gpus``, ``max_cpus`` or
        ``max_memory``, or ''. ``members``: its nodes (CPUs and memory are per member; default: the
        nodes it pinned, else one)."""
        policy, held = self.policy(job.tenant), self.holds(job.tenant)
        n = members or job.nodes or 1
        most = policy.max_gpus
        if most is not None and held.gpus + job.gpus > most:
            return f"tenant {job.tenant} is at its limit of {most} GPU{'s' if most != 1 else ''}"
        if policy.max_cpus is not None and held.cpus + job.cpus * n > policy.max_cpus + 1e-9:
            return f"tenant {job.tenant} is at its limit of {policy.max_cpus:g} CPUs"
        if policy.max_memory is not None and held.memory + job.memory * n > policy.max_memory:
            return f"tenant {job.tenant} is at its limit of {policy.max_memory / (1 << 30):g} GiB of memory"
        return ""

    def add(self, job: PendingJob, members: int = 1) -> None:
        """``job`` was placed (``members`` nodes, each granted its CPUs and memory)."""
        held = self.holds(job.tenant)
        self.held[job.tenant] = held.plus(job.gpus, job.cpus * members, job.memory * members)

    def without(self, tenant: str, gpus: int, cpus: float, memory: int, jobs: int = 1) -> None:
        """A running job of ``tenant`` is to leave (a preemption being planned)."""
        held = self.holds(tenant)
        self.held[tenant] = replace(
            held,
            gpus=held.gpus - gpus,
            cpus=held.cpus - cpus,
            memory=held.memory - memory,
            jobs=held.jobs - jobs,
        )

    def fair_gpus(self, demand: Mapping[str, int]) -> dict[str, float]:
        """Each tenant's fair share of the fleet's GPUs given what it wants (``demand``: GPUs held
        plus GPUs its queued jobs ask)."""
        return fair_gpus(self.fleet.gpus, demand, self.policy)


def fair_gpus(total: float, demand: Mapping[str, int], policy: Callable[[str], Tenant]) -> dict[str, float]:
    """Guarantees first (scaled down together if they exceed the fleet), then the rest by weight,
    water-filled: no tenant gets more than it wants or than its ``max_gpus``, and what one cannot
    take goes to the others by their weights."""
    wants = {t: min(float(d), _cap(policy(t))) for t, d in demand.items() if d > 0}
    share = {t: min(float(policy(t).guaranteed_gpus), w) for t, w in wants.items()}
    given = sum(share.values())
    if given >= total:
        return {t: s * total / given for t, s in share.items()} if given else share
    left, open_ = total - given, {t for t in wants if share[t] < wants[t]}
    while left > 1e-9 and open_:
        weights = sum(policy(t).weight for t in open_)
        offer = {t: left * policy(t).weight / weights for t in open_}
        full = {t for t in open_ if share[t] + offer[t] >= wants[t] - 1e-9}
        if not full:
            for t in open_:
                share[t] += offer[t]
            break
        for t in full:  # these take what they want; the rest is offered again to the others
            left -= wants[t] - share[t]
            share[t] = wants[t]
        open_ -= full
    return share


def _cap(policy: Tenant) -> float:
    return float("inf") if policy.max_gpus is None else float(policy.max_gpus)


def _part(value: float, whole: float) -> float:
    return value / whole if whole > 0 else 0.0
