"""What the status pages show, from the fleet's records: pure functions of the records, the caller's
view (which jobs it may see) and ``now``, so they are tested without a browser or Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleet.models import Gpu, Job, JobState, Node, QueuedJob, TenantStatus

#: what a GPU is doing, one word each; the page colours cells by it
FREE, CLAIMED, OTHERS, BUSY, UNHEALTHY = "free", "claimed", "others", "busy", "unhealthy"


@dataclass(frozen=True)
class GpuCell:
    gpu: Gpu
    status: str
    #: the job holding it when the caller may see that job, else None
    job: str | None = None
    #: what the cell says under its index ("job-1a2b", "another tenant's job", "lost: NVML error")
    note: str = ""


@dataclass(frozen=True)
class NodeCard:
    node: Node
    cells: list[GpuCell]
    #: the node's jobs the caller may see (others' are counted, not named)
    jobs: list[str]
    hidden_jobs: int

    @property
    def free(self) -> int:
        return sum(c.status == FREE for c in self.cells)


def gpu_cell(gpu: Gpu, claim: str | None, visible: Callable[[str], bool]) -> GpuCell:
    """A claim ("job:attempt") first, as ``fleet nodes`` says it; then a foreign process, then health."""
    if claim:
        job = claim.rpartition(":")[0] or claim
        if visible(job):
            return GpuCell(gpu, CLAIMED, job, job)
        return GpuCell(gpu, OTHERS, None, "another tenant's job")
    if gpu.busy:
        return GpuCell(gpu, BUSY, note=gpu.busy)
    if not gpu.healthy:
        return GpuCell(gpu, UNHEALTHY, note=gpu.health)
    return GpuCell(gpu, FREE, note="free")


def node_cards(nodes: Iterable[Node], visible: Callable[[str], bool]) -> list[NodeCard]:
    cards = []
    for node in sorted(nodes, key=lambda n: n.name):
        cells = [
            gpu_cell(g, node.claims.get(g.uuid), visible) for g in sorted(node.gpus, key=lambda g: g.index)
        ]
        shown = [j for j in node.jobs if visible(j)]
        cards.append(NodeCard(node, cells, shown, len(node.jobs) - len(shown)))
    return cards


@dataclass(frozen=True)
class HeldGpu:
    node: str
    index: int
    #: percent, as the node last reported it; None when the node does not report the GPU
    utilization: int | None


@dataclass(frozen=True)
class RunningRow:
    job: Job
    #: seconds since the attempt started (since it was placed, while it is not running yet)
    duration_s: float
    gpus: list[HeldGpu] = field(default_factory=list)

    @property
    def utilization(self) -> float | None:
        """Mean utilization of its GPUs that report one, in percent."""
        known = [g.utilization for g in self.gpus if g.utilization is not None]
        return sum(known) / len(known) if known else None


def running_rows(jobs: Iterable[Job], nodes: Iterable[Node], now: float) -> list[RunningRow]:
    by_uuid = {(n.name, g.uuid): g for n in nodes for g in n.gpus}
    rows = []
    for job in jobs:
        held = []
        for node in job.nodes_held:
            for uuid in job.gpus_on(node):
                gpu = by_uuid.get((node, uuid))
                held.append(HeldGpu(node, gpu.index if gpu else -1, gpu.utilization if gpu else None))
        since = job.started_at if job.state == JobState.RUNNING and job.started_at else job.state_since
        rows.append(RunningRow(job, max(now - since, 0.0) if since else 0.0, held))
    return rows


def by_tenant(entries: Iterable[QueuedJob]) -> dict[str, list[QueuedJob]]:
    """Queue entries grouped by tenant (in the order given: the backend's, rank within tenant)."""
    groups: dict[str, list[QueuedJob]] = {}
    for entry in entries:
        groups.setdefault(entry.position.tenant, []).append(entry)
    return groups


@dataclass(frozen=True)
class TenantRow:
    status: TenantStatus
    #: fraction of the bar the use fills, and where the fair share and guarantee marks sit (0..1)
    used: float
    share: float
    guarantee: float


def tenant_rows(statuses: Iterable[TenantStatus], total_gpus: int) -> list[TenantRow]:
    """Each tenant's use against its share, scaled to the fleet's GPUs (or the largest figure shown)."""
    statuses = list(statuses)
    scale = max(
        [total_gpus, 1, *(max(s.gpus_used, s.fair_share_gpus, s.tenant.guaranteed_gpus) for s in statuses)]
    )
    return [
        TenantRow(s, s.gpus_used / scale, s.fair_share_gpus / scale, s.tenant.guaranteed_gpus / scale)
        for s in statuses
    ]
