"""Ending and changing submitted jobs, as Slurm's ``scancel`` and ``scontrol`` do: ``fleet cancel``
(one job, several, by user or state, an array, labels), ``hold`` and ``release`` (jobs, or arrays'
queued tasks), ``update`` and ``requeue`` (a job array's failed tasks)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from fleet.cli import arrays
from fleet.cli.common import CONTEXT, Globals, complete_jobs, output_option, pairs, pass_globals
from fleet.cli.output import emit_json
from fleet.cli.submit import print_job_line
from fleet.client import Client
from fleet.errors import CorruptRecord, FleetError, NotFound, SpecError
from fleet.models import CancelReport, Job, JobState, TasksChanged

#: the states ``cancel --state`` takes (any not final), as users type them
CANCEL_STATES = [s.value.lower() for s in JobState if not s.final]


@click.command(
    context_settings=CONTEXT,
    short_help="cancel jobs: ids, --user, --state, every task of an array (--array) or --label",
)
@click.argument("job_ids", nargs=-1, metavar="[JOB]...", shell_complete=complete_jobs)
@click.option("--user", help="the jobs this user submitted (within your tenant)")
@click.option(
    "--state",
    type=click.Choice(CANCEL_STATES, case_sensitive=False),
    help="the jobs in this state (within your tenant)",
)
@click.option("--array", "array_id", metavar="ID", help="every task of this job array")
@click.option("--label", multiple=True, metavar="K=V", help="every job with this label (repeat: all of them)")
@output_option
@pass_globals
def cancel(
    globals_: Globals,
    job_ids: tuple[str, ...],
    user: str | None,
    state: str | None,
    array_id: str | None,
    label: tuple[str, ...],
    output: str,
) -> int:
    """Cancel jobs: queued ones at once, running ones are stopped by their agents (their GPUs freed),
    then CANCELLED. Give JOB ids (several: each cancelled, unknown ones named, exit 3), --user U
    and/or --state S (the jobs of your tenant that match all given, with ids: those of them), --array
    ID, or one or more --label K=V (the jobs not yet final that have all of them). Matching nothing is
    no error: it says so."""
    by_filter = bool(job_ids) or user is not None or state is not None
    if [by_filter, bool(array_id), bool(label)].count(True) != 1:
        raise SpecError(
            "cancel: give JOB ids, --user/--state, --array ID or --label K=V (see `fleet cancel --help`)"
        )
    client = globals_.client()
    if len(job_ids) == 1 and user is None and state is None:
        print_job_line(_cancel_one(client, job_ids[0]), output)
        return 0
    if not by_filter:
        report = client.cancel_array(array_id) if array_id else client.cancel_labels(pairs(label, "--label"))
        arrays.print_cancelled(report, output)
        return 0
    report = client.cancel_jobs(job_ids, user=user, state=state)
    _print_report(report, output)
    if report.not_found:
        raise NotFound(f"no job {', '.join(map(repr, report.not_found))} (the others named were cancelled)")
    return 0


def _cancel_one(client: Client, job_id: str) -> Job:
    try:
        return client.cancel(job_id)
    except CorruptRecord:
        raise
    except NotFound as missing:
        arrays.array_or(client, job_id, missing)
        raise NotFound(
            f"{job_id!r} is a job array: cancel its tasks with `fleet cancel --array {job_id}`"
        ) from None


def _print_report(report: CancelReport, output: str) -> None:
    if output == "json":
        emit_json(report)
        return
    for job_id in report.cancelled:
        print(f"{job_id} CANCELLED")
    for job_id in report.stopping:
        print(f"{job_id} stopping (CANCELLED once stopped)")
    done = len(report.cancelled) + len(report.stopping)
    if not done and not report.already_final:
        print("no job matched: nothing cancelled")
        return
    final = f"; {report.already_final} already final" if report.already_final else ""
    print(f"cancelled {done} job(s): {len(report.cancelled)} at once, {len(report.stopping)} stopping{final}")


@click.command(context_settings=CONTEXT, short_help="keep queued jobs (or arrays' tasks) from starting")
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB...", shell_complete=complete_jobs)
@output_option
@pass_globals
def hold(globals_: Globals, job_ids: tuple[str, ...], output: str) -> int:
    """Keep queued jobs from being placed (as Slurm's `scontrol hold`): each stays QUEUED, its
    reason "held by USER", until `fleet release`. A job array's id holds every queued task of it
    (counted; its tasks on nodes or ended are left as they are). A job already on a node, or ended,
    is refused (exit 2); the others named are held all the same."""
    client = globals_.client()
    return _each(job_ids, client.hold, client.hold_array, "held", output)


@click.command(context_settings=CONTEXT, short_help="let held jobs (or arrays' tasks) start again")
@click.argument("job_ids", nargs=-1, required=True, metavar="JOB...", shell_complete=complete_jobs)
@output_option
@pass_globals
def release(globals_: Globals, job_ids: tuple[str, ...], output: str) -> int:
    """Let held jobs be placed again (a job not held is left as it is); a job array's id releases
    every held task of it (counted)."""
    client = globals_.client()
    return _each(job_ids, client.release, client.release_array, "released", output)


def _each(
    job_ids: tuple[str, ...],
    act: Callable[[str], Job],
    on_array: Callable[[str], TasksChanged],
    done: str,
    output: str,
) -> int:
    """``act`` on every job named (``on_array`` on a job array's id): each one's line, and a
    ``fleet:`` line for each refused; the exit code of the first refusal (0 when none)."""
    code = 0
    for job_id in job_ids:
        try:
            _one(job_id, act, on_array, done, output)
        except FleetError as exc:
            print(f"fleet: {exc}", file=sys.stderr)
            code = code or exc.exit_code
    return code


def _one(
    job_id: str, act: Callable[[str], Job], on_array: Callable[[str], TasksChanged], done: str, output: str
) -> None:
    try:
        print_job_line(act(job_id), output)
        return
    except CorruptRecord:
        raise
    except NotFound as missing:
        report = _array_or(job_id, on_array, missing)
    if output == "json":
        emit_json(report)
        return
    print(
        f"{job_id}: {done} {report.changed} task(s); {report.already} already {done}, "
        f"{report.not_queued} not queued (on nodes or ended)"
    )


def _array_or(array_id: str, on_array: Callable[[str], TasksChanged], missing: NotFound) -> TasksChanged:
    """``on_array`` for the job array ``array_id``, else ``missing`` (no job or array by that id)."""
    try:
        return on_array(array_id)
    except CorruptRecord:
        raise
    except NotFound:
        raise missing from None


@click.command(context_settings=CONTEXT, short_help="change a queued job, or a running job's time limit")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--priority", type=int, help="-1000..1000; higher runs first within its tenant")
@click.option("--gpus", type=int, help="GPUs (a rigid job's; an elastic one: `fleet resize`)")
@click.option(
    "--timeout", metavar="DURATION", help="wall-clock limit of each attempt, e.g. 30m, 2h (a running job too)"
)
@output_option
@pass_globals
def update(
    globals_: Globals, job: str, priority: int | None, gpus: int | None, timeout: str | None, output: str
) -> int:
    """Change a queued job (as Slurm's `scontrol update`), checked as a submit is: the same limits,
    the job keeps its submission order. Of a job already on a node only --timeout changes: its node
    stops the running attempt at the new limit, counted from the attempt's start (`fleet show` says
    the time left); anything else is refused (exit 2): cancel it and submit again."""
    print_job_line(globals_.client().update(job, priority=priority, gpus=gpus, timeout=timeout), output)
    return 0


@click.command(context_settings=CONTEXT, short_help="run a job array's failed tasks again, same ids")
@click.argument("array_id", metavar="ARRAY", shell_complete=complete_jobs)
@click.option("--failed", is_flag=True, help="its FAILED tasks")
@click.option("--cancelled", is_flag=True, help="its CANCELLED tasks")
@output_option
@pass_globals
def requeue(globals_: Globals, array_id: str, failed: bool, cancelled: bool, output: str) -> int:
    """Queue a job array's FAILED (--failed) and/or CANCELLED (--cancelled) tasks again, each under its
    own id and index (`fleet show ARRAY` counts them QUEUED again): its next attempt, with a fresh
    retry budget, resuming from its last checkpoint. The other tasks are left as they are."""
    if not (failed or cancelled):
        raise SpecError("requeue: say which tasks to run again: --failed, --cancelled or both")
    report = globals_.client().requeue(array_id, failed=failed, cancelled=cancelled)
    if output == "json":
        emit_json(report)
        return 0
    for job_id in report.requeued:
        print(f"{job_id} QUEUED")
    gone = f"; {report.gone} deleted by retention" if report.gone else ""
    if not report.requeued:
        print(f"no task of {array_id} to run again ({report.left} in other states{gone})")
        return 0
    print(f"requeued {len(report.requeued)} task(s) of {array_id}; {report.left} left as they are{gone}")
    return 0
