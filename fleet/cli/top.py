"""``fleet top``: the fleet at a glance, redrawn live: GPUs per node, running jobs, queues per tenant."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import click

from fleet.cli.common import CONTEXT, Globals, output_option, pass_globals
from fleet.cli.elastic import gpus_cell
from fleet.cli.jobs import short
from fleet.cli.nodes import free_gpus, gpu_status
from fleet.cli.output import present
from fleet.cli.view import Table, View
from fleet.client import Client
from fleet.models import Job, JobState, Node, TenantStatus
from fleet.progress import label
from fleet.text import size, took

#: the running jobs a frame asks for (the API's page size); more are counted, not listed
RUNNING_LIMIT = 500


@click.command(
    context_settings=CONTEXT, short_help="live view: GPUs per node, running jobs, queues per tenant"
)
@click.option("--once", is_flag=True, help="print one frame and exit (for scripts and tests)")
@click.option("-n", "--interval", type=float, default=2.0, show_default=True, help="seconds between frames")
@output_option
@pass_globals
def top(globals_: Globals, once: bool, interval: float, output: str) -> int:
    """The fleet at a glance, redrawn every --interval seconds until Ctrl-C: each node's GPUs (free,
    claimed by which job attempt, or why not placeable) with their utilisation where the node reports
    it (NVML), the running jobs with their elapsed time and progress, and each tenant's queue.
    Piped: a new frame each interval; --once: one frame."""
    if interval <= 0:
        raise click.BadParameter(f"{interval:g}: expected seconds above 0", param_hint="--interval")
    client = globals_.client()
    return present(lambda: frame(client, output), None if once else interval, output, screen=True)


def frame(client: Client, output: str) -> View | dict[str, Any]:
    nodes = client.nodes()
    running = client.jobs(JobState.RUNNING, RUNNING_LIMIT)
    tenants = client.tenants()
    if output == "json":
        return {"nodes": nodes, "running": running, "tenants": tenants}
    now = time.time()
    view = View([summary(nodes, running, tenants, now)])
    view.add(
        Table(
            ["NODE", "STATE", "IDX", "MODEL", "MEMORY", "UTIL", "STATUS"],
            gpu_rows(nodes),
            title="GPUs",
            wide=6,
        )
    )
    view.add(
        Table(
            ["JOB", "USER", "TENANT", "GPUS", "NODE", "ELAPSED", "PROGRESS", "REASON"],
            [running_row(j, now) for j in running],
            title="Running",
            wide=7,
        )
    )
    view.add(
        Table(
            ["TENANT", "QUEUED", "RUNNING", "GPUS", "FAIR SHARE", "GUARANTEED"],
            [queue_row(t, Counter(j.spec.tenant for j in running)) for t in tenants],
            title="Queues",
        )
    )
    return view


def summary(nodes: list[Node], running: list[Job], tenants: list[TenantStatus], now: float) -> str:
    gpus = sum(len(n.gpus) for n in nodes)
    free = sum(free_gpus(n) for n in nodes)
    queued = sum(t.jobs_pending for t in tenants)
    up = sum(1 for n in nodes if n.alive)
    return (
        f"fleet top  {time.strftime('%H:%M:%S', time.localtime(now))}  nodes {up}/{len(nodes)} up  "
        f"GPUs {free} free of {gpus}  jobs {len(running)} running, {queued} queued"
    )


def gpu_rows(nodes: list[Node]) -> list[tuple[object, ...]]:
    """One row a GPU; the node's name and state on its first GPU's row only (a node without GPUs:
    one row of its own)."""
    rows: list[tuple[object, ...]] = []
    for node in nodes:
        state = node.state.value if node.alive or node.state.value == "DOWN" else f"{node.state.value} (lost)"
        if not node.gpus:
            rows.append((node.name, state, "-", "-", "-", "-", "no GPUs"))
        for i, g in enumerate(sorted(node.gpus, key=lambda g: g.index)):
            memory = f"{size(g.memory_used)}/{size(g.memory_total)}"
            # a simulated inventory reports no utilisation: a 0% there would be made up
            util = f"{g.utilization}%" if node.gpu_backend == "nvml" else "-"
            rows.append(
                (
                    node.name if i == 0 else "",
                    state if i == 0 else "",
                    g.index,
                    g.model,
                    memory,
                    util,
                    gpu_status(node, g),
                )
            )
    return rows


def running_row(job: Job, now: float) -> tuple[object, ...]:
    node = f"{job.node}+{len(job.members) - 1}" if len(job.members) > 1 else job.node
    elapsed = took(now - job.started_at) if job.started_at else "-"
    return (
        job.id,
        job.owner or "-",
        job.spec.tenant,
        gpus_cell(job),
        node,
        elapsed,
        label(job.progress),
        short(job.reason, 40),
    )


def queue_row(status: TenantStatus, running: Counter[str]) -> tuple[object, ...]:
    """A tenant's line: its jobs queued and running now (the API counts the queue as it stands; the
    running, from this frame's), its GPUs and shares as the leader last published them."""
    return (
        status.tenant.name,
        status.jobs_pending,
        running[status.tenant.name],
        status.gpus_used,
        f"{status.fair_share_gpus:.1f}",
        status.tenant.guaranteed_gpus,
    )
