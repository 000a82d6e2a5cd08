"""Reading jobs: ``fleet jobs``, ``show``, ``logs``, ``wait`` (ending and changing them: control.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import click

from fleet.cli import arrays
from fleet.cli.common import (
    CONTEXT,
    Globals,
    complete_jobs,
    job_goes_on,
    output_option,
    pairs,
    pass_globals,
    watch_option,
)
from fleet.cli.elastic import fields as elastic_fields
from fleet.cli.elastic import gpus_cell
from fleet.cli.output import emit_json, present, show_view
from fleet.cli.showing import about
from fleet.cli.submit import EXIT_FOR_STATE, print_job_line
from fleet.cli.view import Bar, Field, Table, View
from fleet.client import ArrayHandle, Client
from fleet.models import Job, JobArray, JobState
from fleet.progress import bar, label, parse_line
from fleet.text import clock, guarantee, iso, nbytes, ordinal, size, stamp, took

if TYPE_CHECKING:
    from fleet.models import LogLine

#: PROGRESS before REASON: the columns before it keep the places scripts know
JOB_HEADERS = [
    "ID",
    "STATE",
    "USER",
    "TENANT",
    "GPUS",
    "NODE",
    "ATTEMPT",
    "START",
    "ELAPSED",
    "EXIT",
    "PROGRESS",
    "REASON",
]
#: the columns a narrow terminal leaves out of `fleet jobs`, first to last: ATTEMPT, START, USER, TENANT, EXIT
NARROW_DROPS = (6, 7, 2, 3, 9)


@click.command(
    context_settings=CONTEXT,
    short_help="list jobs, newest first; a job array is one line with its tasks per state",
)
@click.option(
    "--state",
    callback=lambda _c, _p, v: _state(v),
    metavar="STATE",
    shell_complete=lambda _c, _p, typed: [s.value for s in JobState if s.value.startswith(typed.upper())],
    help=f"only jobs in this state: {', '.join(s.value for s in JobState)} (any case)",
)
@click.option("--limit", type=int, default=100, show_default=True, help="at most this many, newest first")
@click.option("--tenant", help="only this tenant's (operators and admins; a user sees its own)")
@click.option("--user", help="only those this user submitted")
@click.option(
    "--label",
    multiple=True,
    metavar="K=V",
    help="only jobs carrying it (repeat: all), array tasks one by one: --label fleet.array=ID lists an "
    "array's tasks",
)
@watch_option
@output_option
@pass_globals
def jobs(
    globals_: Globals,
    state: str | None,
    limit: int,
    tenant: str | None,
    user: str | None,
    label: tuple[str, ...],
    watch: float | None,
    output: str,
) -> int:
    """List jobs, newest first; a job array is one line with its tasks per state."""
    client = globals_.client()
    labels = pairs(label, "--label") or None

    def frame() -> View | list[Job] | list[Job | JobArray]:
        # a label is a job's: an array's tasks carry theirs (fleet.array, fleet.array.index) one by one
        found: list[Job] | list[Job | JobArray] = (
            client.jobs(state, limit, tenant, user, labels)
            if labels
            else client.listing(state, limit, tenant, user)
        )
        if output == "json":
            return found
        now = time.time()
        rows = [job_row(j, now) if isinstance(j, Job) else arrays.row(j) for j in found]
        note_quarantined("job", client.quarantined_jobs(), "fleet show ID")
        return View([Table(JOB_HEADERS, rows, wide=len(JOB_HEADERS) - 1, optional=NARROW_DROPS)])

    return present(frame, watch, output)


def _state(text: str | None) -> str | None:
    """``--state`` in any case, as the API takes it."""
    if text is None or text.upper() in JobState.__members__:
        return None if text is None else text.upper()
    raise click.BadParameter(f"{text!r}: expected one of {', '.join(s.value for s in JobState)}")


def job_row(j: Job, now: float) -> tuple[object, ...]:
    """A job's line: START and ELAPSED are its latest attempt's run; "-" for a job not running since
    it was last queued (waiting, or ended without starting: its ELAPSED does not tick)."""
    start = j.started_at if j.started_at and j.state != JobState.QUEUED else None
    elapsed = took((j.finished_at or now) - start) if start else "-"
    node = f"{j.node}+{len(j.members) - 1}" if len(j.members) > 1 else j.node
    progress = label(j.progress)
    return (
        j.id,
        j.state.value,
        j.owner or "-",
        j.spec.tenant,
        gpus_cell(j),
        node,
        j.attempt,
        clock(start, now),
        elapsed,
        j.exit_code,
        progress,
        short(j.reason, 50),
    )


def note_quarantined(kind: str, records: dict[str, str], show: str) -> None:
    if records:
        print(
            f"fleet: {len(records)} {kind} record(s) unreadable and quarantined, not listed: "
            f"{', '.join(sorted(records))} (`{show}` says why)",
            file=sys.stderr,
        )


def short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command(
    context_settings=CONTEXT,
    short_help="one job: spec, state, progress, attempts and history; or a job array's tasks",
)
@click.argument("job", metavar="ID", shell_complete=complete_jobs)
@output_option
@pass_globals
def show(globals_: Globals, job: str, output: str) -> int:
    """One job: spec, state, node, GPUs, progress, attempts, the jobs it waits for and history; or a
    job array: its tasks per state."""
    client = globals_.client()
    found = arrays.job_or_array(client, job)
    if isinstance(found, JobArray):
        return arrays.show(found, output)
    history = client.history(job)
    if output == "json":
        emit_json({**found.model_dump(mode="json"), "history": history})
        return 0
    view = _job_view(found)
    if found.state == JobState.QUEUED:
        _standing(client, found, view)
    view.add("History:").add(
        Table(
            ["TIME", "STATE", "ATTEMPT", "NODE", "REASON"],
            [(stamp(e.at), e.state, e.attempt, e.node, e.reason) for e in history],
            indent=2,
            wide=4,
        )
    )
    show_view(view)
    return 0


def _job_view(job: Job, now: float | None = None) -> View:
    spec = job.spec
    view = View(
        [
            Field("Job", f"{job.id}  ({spec.name}, tenant {spec.tenant})"),
            Field("State", f"{job.state.value}  {job.reason}{_countdown(job)}", state=True),
            Field("Image", spec.image or "(the fleet default_image)"),
            Field("Command", " ".join(spec.command)),
            Field(
                "Resources",
                f"gpus={spec.gpus} cpus={spec.cpus or '-'} memory={size(spec.memory)} "
                f"shm={size(spec.shm_size)} priority={spec.priority}",
            ),
        ]
    )
    for line in elastic_fields(job):
        view.add(line)
    if (used := job.attained_gpu_s(time.time() if now is None else now)) > 0:
        view.add(Field("GPU time", f"{used / 3600:,.2f} GPU-hours, its attempts together"))
    if job.progress is not None:
        view.add(_progress(job))
    if job.array_id is not None:
        limit = f" (array max running {job.array_max_running})" if job.array_max_running else ""
        view.add(Field("Array", f"{job.array_id}, task {job.array_index}{limit}"))
    if job.members:
        rank0 = f"rank 0 at {job.master_addr}:{job.master_port}"
        view.add(Field("Members", f"{len(job.members)} nodes, {rank0}"))
        for rank, (member, phase) in enumerate(zip(job.members, job.member_phases, strict=True)):
            gpus = ", ".join(member.gpus) or "-"
            view.add(f"  rank {rank}: {member.node}  GPUs {gpus}  {phase or 'not started'}")
    else:
        view.add(Field("Node", job.node or "-")).add(Field("GPUs", ", ".join(job.gpus) or "-"))
    view.add(
        Field(
            "Attempts",
            f"{job.attempt} (failures {job.failures} of {spec.max_attempts} allowed, "
            f"infrastructure requeues {job.infra_requeues})",
        )
    )
    view.add(Field("Exit code", "-" if job.exit_code is None else str(job.exit_code)))
    view.add(Field("Checkpoint", job.checkpoint or "-"))
    view.add(Field("Outputs", outputs_line(job)))
    for line in about(job, time.time()):
        view.add(line)
    return view


def _progress(job: Job) -> Field | Bar:
    """The job's last progress report: a bar against its total, else the step it reached."""
    p = job.progress
    assert p is not None
    metrics = "  " + " ".join(f"{k}={v:g}" for k, v in sorted(p.metrics.items())) if p.metrics else ""
    when = f" ({took(time.time() - p.at)} ago)" if p.at else ""
    if p.fraction is None:
        return Field("Progress", f"step {p.step}{when}{metrics}")
    return Bar("Progress", p.fraction, f"{p.fraction * 100:.0f}%  step {p.step} of {p.total}{when}{metrics}")


def _standing(client: Client, job: Job, view: View) -> None:
    """Where a queued job stands, and its tenant against its share: what a user can act on."""
    where = client.position(job.id)
    if where is not None:
        view.add(
            Field(
                "Queue",
                f"{ordinal(where.in_tenant)} of {where.tenant_queued} in tenant "
                f"{where.tenant}'s queue (by priority, then submission); {where.overall - 1} of "
                f"{where.queued} queued jobs outrank it overall (tenants take turns by fair share)",
            )
        )
    tenant = next((t for t in client.tenants() if t.tenant.name == job.spec.tenant), None)
    if tenant is not None:
        policy = tenant.tenant
        limit = "no limit" if policy.max_gpus is None else f"max {policy.max_gpus}"
        view.add(
            Field(
                "Tenant",
                f"{policy.name} uses {tenant.gpus_used} GPUs; fair share now "
                f"{tenant.fair_share_gpus:.1f}, guaranteed {guarantee(policy)}, {limit}, weight "
                f"{policy.weight:g}",
            )
        )


def _countdown(job: Job) -> str:
    """Stored reasons hold no countdown (they would change every pass); render it here."""
    left = job.not_before - time.time()
    return f" (next attempt in {left:.0f}s)" if job.state == JobState.QUEUED and left > 0 else ""


@click.command(context_settings=CONTEXT, short_help="a job's output (latest attempt unless --attempt)")
@click.argument("job", shell_complete=complete_jobs)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="keep printing new lines until the attempt ends (Ctrl-C: the job goes on)",
)
@click.option("--attempt", type=int, help="this attempt's output (default: the latest)")
@click.option("--rank", type=int, default=0, show_default=True, help="a multi-node job's member")
@click.option("-t", "--timestamps", is_flag=True, help="prefix each line with when it was shipped (ISO 8601)")
@output_option
@pass_globals
def logs(
    globals_: Globals, job: str, follow: bool, attempt: int | None, rank: int, timestamps: bool, output: str
) -> int:
    """A job's output (latest attempt unless --attempt); -o json: one JSON object a line."""
    client = globals_.client()
    with job_goes_on(job, "following" if follow else "reading the output of"):
        lines: Iterable[LogLine] = (
            client.follow_logs(job, attempt, rank=rank) if follow else client.logs(job, attempt, rank)
        )
        for line in lines:
            if output == "json":
                record = {"at": line.at, "time": iso(line.at), "attempt": line.attempt, "line": line.line}
                print(json.dumps(record), flush=follow)
                continue
            report = parse_line(line.line, line.at) if follow else None  # followed: a bar, not the JSON
            text = line.line if report is None else f"progress {bar(report)}"
            print(f"{iso(line.at)} {text}" if timestamps else text, flush=follow)
    return 0


@click.command(
    context_settings=CONTEXT,
    short_help="wait for a job or job array; exit 0 SUCCEEDED, 1 FAILED, 6 CANCELLED, 4 timeout",
)
@click.argument("job", metavar="ID", shell_complete=complete_jobs)
@click.option("--timeout", type=float, help="seconds (default: forever)")
@output_option
@pass_globals
def wait(globals_: Globals, job: str, timeout: float | None, output: str) -> int:
    """Wait for a job (or every task of a job array) to end; exit 0 SUCCEEDED, 1 FAILED, 6 CANCELLED,
    4 on --timeout. Ctrl-C stops waiting (exit 130); the job goes on."""
    client = globals_.client()
    with job_goes_on(job):
        found = arrays.job_or_array(client, job)
        if isinstance(found, JobArray):
            with job_goes_on(found.id, array=True):
                ended = ArrayHandle(client, found.id).wait(timeout)
            return arrays.result(ended, output)
        done = client.wait(job, timeout)
    print_job_line(done, output)
    return EXIT_FOR_STATE[done.state]


def outputs_line(job: Job) -> str:
    """What is kept of the job's outputs (``fleet download``), and why something was not."""
    kept = (
        f"{nbytes(job.outputs_bytes)} kept from {job.spec.outputs}/ of attempt {job.outputs_attempt} "
        f"(fleet download {job.id})"
        if job.outputs_bytes is not None
        else "-"
    )
    return f"{kept}; {job.outputs_note}" if job.outputs_note else kept
