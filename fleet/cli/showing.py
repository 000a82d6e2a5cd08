"""What ``fleet show`` says of a job beyond its state: who submitted it, its time limit and the time
left, its labels, the names of its environment variables (never their values: they may hold
secrets), and the directory shipped with it (its digest and size)."""

from __future__ import annotations

from fleet.cli.view import Field
from fleet.models import Job, JobState
from fleet.text import nbytes, took

#: states in which an attempt runs against its time limit
_TIMED = (JobState.STARTING, JobState.RUNNING)


def about(job: Job, now: float) -> list[Field]:
    spec = job.spec
    return [
        Field("User", job.owner or "-"),
        Field("Time limit", time_limit(job, now)),
        Field("Labels", " ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or "-"),
        Field("Env", " ".join(sorted(spec.env)) or "-"),
        Field("Workdir", workdir(job)),
    ]


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
