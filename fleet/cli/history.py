"""Accounting, as Slurm's ``sacct``/``sreport``: ``fleet history``."""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from fleet.cli.common import CONTEXT, Globals, pass_globals
from fleet.cli.output import emit_json, show_view
from fleet.cli.view import Table, View
from fleet.models.usage import GROUPINGS, History, Usage, UsageRow, parse_when, total
from fleet.text import iso, stamp, took

_USAGE_HEADERS = ["JOBS", "SUCCEEDED", "FAILED", "CANCELLED", "WALL-H", "GPU-H", "CPU-H"]
_JOB_COLUMNS = ["job", "tenant", "user", "name", "state", "gpus", "attempts", "submitted", "started", "ended"]
_JOB_HEADERS = ["JOB", "TENANT", "USER", "NAME", "STATE", "GPUS", "ATTEMPTS", "SUBMITTED", "STARTED", "ENDED"]


@click.command(
    context_settings=CONTEXT,
    short_help="GPU-hours and jobs per tenant, user or job over a period, kept after jobs expire",
)
@click.option(
    "--since",
    default="30d",
    show_default=True,
    metavar="WHEN",
    help="from: a span back from now (30d, 12h, 2w, 90m) or an ISO date or time (2025-01-31)",
)
@click.option("--until", metavar="WHEN", help="to (not included), as --since; default now")
@click.option("--tenant", help="this tenant's jobs only (a user's token reads its own tenant's)")
@click.option("--user", help="this user's jobs only")
@click.option(
    "--by",
    type=click.Choice(GROUPINGS),
    default="user",
    show_default=True,
    help="a line per tenant, per tenant and user, or per job",
)
@click.option("--limit", type=int, default=1000, show_default=True, help="--by job: the newest this many")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="table for people, csv for spreadsheets, json for scripts",
)
@pass_globals
def history(
    globals_: Globals,
    since: str,
    until: str | None,
    tenant: str | None,
    user: str | None,
    by: str,
    limit: int,
    output: str,
) -> int:
    """What the jobs that ended in a period used, as Slurm's sacct/sreport: jobs run, succeeded,
    failed and cancelled, wall time (hours running, over all attempts), GPU-hours and CPU-hours
    (those hours times the GPUs and CPUs each attempt held: requeues and resizes included), per
    tenant and user (default), per tenant (--by tenant) or per job (--by job). Each job leaves its
    row when it ends, kept accounting_retention_s (400 days) after job records expire.

    \b
    fleet history                                     # the last 30 days, per tenant and user
    fleet history --since 2025-01-01 --until 2025-02-01 --by tenant -o csv > january.csv
    fleet history --since 2w --user alice --by job
    """
    now = time.time()
    start = parse_when(since, now, "--since")
    end = None if until is None else parse_when(until, now, "--until")
    found = globals_.client().usage(start, end, tenant=tenant, user=user, by=by, limit=limit)
    if output == "json":
        emit_json(found)
    elif output == "csv":
        write_csv(found)
    else:
        show_view(view(found))
    return 0


def view(found: History) -> View:
    period = f"{stamp(found.since)} to {stamp(found.until)}"
    if found.by == "job":
        out = View([Table([*_JOB_HEADERS, "WALL", "GPU-H"], [_job_cells(r) for r in found.jobs])])
        if found.truncated:
            out.add(f"(the newest {len(found.jobs)} jobs: --limit shows more)")
        totals = total(found.usage)
        out.add(f"{totals.jobs} jobs ended {period}: {_hours(totals.gpu_s)} GPU-hours")
        return out
    first = ["TENANT"] if found.by == "tenant" else ["TENANT", "USER"]
    rows = [[*_group_cells(u, found.by), *_usage_cells(u)] for u in found.usage]
    if found.usage:
        rows.append(["TOTAL", *([""] if found.by == "user" else []), *_usage_cells(total(found.usage))])
    out = View([Table([*first, *_USAGE_HEADERS], rows)])
    out.add(f"(jobs that ended {period})" if found.usage else f"no job ended {period}")
    return out


def write_csv(found: History) -> None:
    """One header line, then a line per group (or job): numbers plain, hours to 4 places, times
    ISO 8601 (UTC)."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    if found.by == "job":
        out.writerow([*_JOB_COLUMNS, "wall_hours", "gpu_hours", "cpu_hours"])
        for r in found.jobs:
            times = [iso(r.submitted_at) if r.submitted_at else "", iso(r.started_at) if r.started_at else ""]
            hours = [_hours(r.run_s, 4), _hours(r.gpu_s, 4), _hours(r.cpu_s, 4)]
            out.writerow(
                [r.id, r.tenant, r.user, r.name, r.state, r.gpus, r.attempts, *times, iso(r.ended_at), *hours]
            )
        return
    first = ["tenant"] if found.by == "tenant" else ["tenant", "user"]
    out.writerow([*first, "jobs", "succeeded", "failed", "cancelled", "wall_hours", "gpu_hours", "cpu_hours"])
    for u in found.usage:
        out.writerow(
            [*_group_cells(u, found.by), u.jobs, u.succeeded, u.failed, u.cancelled, *_hours_of(u, 4)]
        )


def _group_cells(usage: Usage, by: str) -> list[str]:
    return [usage.tenant] if by == "tenant" else [usage.tenant, usage.user or ""]


def _usage_cells(u: Usage) -> list[Any]:
    return [u.jobs, u.succeeded, u.failed, u.cancelled, *_hours_of(u, 1)]


def _hours_of(u: Usage, places: int) -> list[str]:
    return [_hours(u.run_s, places), _hours(u.gpu_s, places), _hours(u.cpu_s, places)]


def _job_cells(r: UsageRow) -> Sequence[Any]:
    started = stamp(r.started_at) if r.started_at else "-"
    cells = [r.id, r.tenant, r.user or "-", r.name, r.state, r.gpus, r.attempts, stamp(r.submitted_at)]
    return [*cells, started, stamp(r.ended_at), took(r.run_s), _hours(r.gpu_s)]


def _hours(seconds: float, places: int = 1) -> str:
    return f"{seconds / 3600:.{places}f}"
