"""What ``fleet show`` says of a job beyond its state: who submitted it, its time limit and the time
left, its labels, the names of its environment variables (never their values: they may hold
secrets), the directory shipped with it (its digest and size), the jobs it waits for, and a function
job's call and result."""

from __future__ import annotations

from fleet.cli.view import Field
from fleet.models import Job, JobState
from fleet.text import nbytes, took

#: states in which an attempt runs against its time limit
_TIMED = (JobState.STARTING, JobState.RUNNING)
#: the jobs it waits for named on ``After``; past them, how many more (an array's tasks count one each)
AFTER_SHOWN = 10


def about(job: Job, now: float) -> list[Field]:
    spec = job.spec
    return [
        Field("User", job.owner or "-"),
        Field("Time limit", time_limit(job, now)),
        Field("Labels", " ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or "-"),
        Field("Env", " ".join(sorted(spec.env)) or "-"),
        Field("Workdir", workdir(job)),
        Field("After", after(job)),
        *function(job),
    ]


def function(job: Job) -> list[Field]:
    """A function job's call (``calc.squares(100, offset=1)``) and the size of its kept result
    (its outputs: the outcome, and what else the function left there); nothing for another job."""
    call = job.spec.call
    if call is None:
        return []
    result = "-"
    if job.outputs_bytes is not None and job.outputs_attempt == job.attempt and job.state.final:
        result = (
            f"{nbytes(job.outputs_bytes)} kept with attempt {job.attempt}'s outputs (fleet result {job.id})"
        )
    elif job.state.final:
        result = f"none kept{f': {job.outputs_note}' if job.outputs_note else ''}"
    return [Field("Function", f"{call.function}({call.args})"), Field("Result", result)]


def after(job: Job) -> str:
    """The jobs it waits for, each with what it waits for (``ok``, ``any``, ``notok``), a call's
    input saying its result is taken: ``prep-3fa2 (ok, result taken), train-9b1c (any)``."""
    deps = job.spec.after
    if not deps:
        return "-"
    inputs = set(job.spec.call.inputs) if job.spec.call is not None else set()
    shown = [f"{d.job} ({d.when}{', result taken' if d.job in inputs else ''})" for d in deps[:AFTER_SHOWN]]
    more = f" and {len(deps) - AFTER_SHOWN:,} more" if len(deps) > AFTER_SHOWN else ""
    return ", ".join(shown) + more


def workdir(job: Job) -> str:
    """The shipped directory's digest, and what it holds as the API found it at upload:
    ``sha256:1f2e3d4c5b6a… (12.3 MiB, 1,204 files; 3.1 MiB packed)``."""
    digest, size = job.spec.workdir, job.spec.workdir_size
    if not digest:
        return "-"
    if size is None:  # uploaded before fleet recorded sizes
        return digest
    files = f"{size.files:,} file{'' if size.files == 1 else 's'}"
    return f"{digest[:19]}… ({nbytes(size.bytes)}, {files}; {nbytes(size.packed)} packed)"


def time_limit(job: Job, now: float) -> str:
    """The limit of each attempt, and while one runs, the time it has left."""
    limit = job.spec.timeout
    if limit is None:
        return "none"
    text = f"{took(limit)} an attempt"
    if job.state in _TIMED and job.started_at:
        left = job.started_at + limit - now
        text += f", {took(max(left, 0.0))} left" if left > 0 else ", reached"
    return text
