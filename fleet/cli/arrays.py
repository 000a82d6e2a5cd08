"""The CLI's job-array pieces: ``--array`` parsing, the array's line and summary, bulk cancel output."""

from __future__ import annotations

import time

from fleet.cli.output import emit_json
from fleet.client import Client
from fleet.errors import CorruptRecord, NotFound, SpecError
from fleet.models import CancelReport, Job, JobArray, JobState
from fleet.models.arrays import parse_indices
from fleet.text import size, stamp, took

#: exit codes of a finished array (see fleet.cli.main): a FAILED task wins over a CANCELLED one
EXIT_FAILED, EXIT_CANCELLED = 1, 6


def indices(text: str, max_running: int | None) -> tuple[int, ...]:
    """``--array``'s indices; a bad value or ``--max-running`` is a SpecError naming the flag (exit 2)."""
    try:
        chosen = parse_indices(text)
    except ValueError as exc:
        raise SpecError(f"--array {text!r}: {exc}") from None
    if max_running is not None and max_running < 1:
        raise SpecError(f"--max-running {max_running}: expected at least 1 task")
    return chosen


def states(array: JobArray) -> str:
    """``QUEUED=9990 RUNNING=10``: the states its tasks are in, in lifecycle order."""
    return " ".join(f"{s.value}={n}" for s, n in array.tasks.items() if n) or "no tasks"


def row(a: JobArray) -> tuple[object, ...]:
    """The array as one line of ``fleet jobs``."""
    limit = f", max running {a.max_running}" if a.max_running else ""
    since = took(time.time() - a.created_at)
    return (
        a.id,
        states(a),
        a.owner or "-",
        a.spec.tenant,
        a.spec.gpus,
        "-",
        "-",
        "-",
        since,
        "-",
        None,
        f"job array of {a.size}{limit}",
    )


def result(array: JobArray, output: str) -> int:
    """Print a finished array's line; its exit code: 1 if a task FAILED, else 6 if one was CANCELLED."""
    if output == "json":
        emit_json(array)
    else:
        print(f"{array.id} {states(array)}")
    if array.tasks.get(JobState.FAILED):
        return EXIT_FAILED
    return EXIT_CANCELLED if array.tasks.get(JobState.CANCELLED) else 0


def show(array: JobArray, output: str) -> int:
    if output == "json":
        emit_json(array)
        return 0
    spec, first = array.spec, array.indices.split(",")[0].split("-")[0]
    limit = f", at most {array.max_running} on nodes at once" if array.max_running else ""
    indices = array.indices if len(array.indices) <= 60 else array.indices[:59] + "…"
    print(f"Job array:  {array.id}  ({spec.name}, tenant {spec.tenant})")
    print(f"Tasks:      {array.size} (indices {indices}){limit}")
    print(f"States:     {states(array)}")
    print(f"Image:      {spec.image or '(the fleet default_image)'}")
    print(f"Command:    {' '.join(spec.command)}")
    print(
        f"Resources:  gpus={spec.gpus} cpus={spec.cpus or '-'} memory={size(spec.memory)} "
        f"shm={size(spec.shm_size)} priority={spec.priority} (each task)"
    )
    print(f"Submitted:  {stamp(array.created_at)}")
    if array.failed:
        more = " (the first shown)" if array.tasks.get(JobState.FAILED, 0) > len(array.failed) else ""
        print(f"Failed:     {', '.join(array.failed)}{more}")
    print(
        f"Each task is the job {array.id}-INDEX: `fleet show {array.id}-{first}`, "
        f"`fleet logs {array.id}-{first}`"
    )
    return 0


def print_cancelled(report: CancelReport, output: str) -> None:
    if output == "json":
        emit_json(report)
    else:
        print(
            f"cancelled {len(report.cancelled)} queued job(s); stopping {len(report.stopping)} on nodes "
            f"(CANCELLED once stopped); {report.already_final} already final"
        )


def job_or_array(client: Client, ident: str) -> Job | JobArray:
    """The job ``ident``, else the job array ``ident``; else why there is no job by that id (it
    expired, it never was). A quarantined job or array stays the error it is."""
    try:
        return client.get(ident)
    except CorruptRecord:
        raise
    except NotFound as missing:
        return array_or(client, ident, missing)


def array_or(client: Client, ident: str, missing: NotFound) -> JobArray:
    """The job array ``ident``, else ``missing`` (what was said of the job by that id) is raised."""
    try:
        return client.array(ident)
    except CorruptRecord:
        raise
    except NotFound:
        raise missing from None
