"""The results a function job's call takes as arguments (``g.submit(f.submit(x))``): the outcomes
of the jobs its ``call.inputs`` names, read where those jobs' outputs are kept, for the launch to
put beside the call (:data:`fleet.agent.runtime.base.INPUTS_DIR`). Never unpickled here.

The job may run on another node than the ones that ran its inputs: their outcomes are read from the
checkpoint storage every node mounts, as ``fleet download`` and ``result()`` read them through the
API (:mod:`fleet.outputs`). Only the job's own tenant's: each input must be a job of that tenant
that SUCCEEDED (the API admitted the call only with each input in its ``after``, and the leader
placed it only once each succeeded), and the outcome is read only under that tenant's kept outputs,
through no link, from the attempt that ended the job.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from fleet.errors import LaunchError
from fleet.models import Job, JobState
from fleet.outputs import FILES, kept_dir, open_dir, open_file, open_under, read_kept
from fleet.state.jobs import JobStore

#: where an outcome is inside a job's kept outputs (``fleet_worker.call``'s FOLDER and OUTCOME)
OUTCOME_PATH = (".fleet-function", "outcome")
#: most bytes of results one call is handed (each is at most 64 MiB pickled): held in memory until
#: the attempt's working directory is made
INPUTS_MAX_BYTES = 1 << 30


def passed_results(job: Job, jobs: JobStore, root: Path) -> dict[str, bytes]:
    """The outcome of each job whose result ``job``'s call takes, by id; :class:`LaunchError` (the
    job's: it cannot run) naming an input that is not its tenant's, did not succeed or left none."""
    inputs = job.spec.call.inputs if job.spec.call is not None else []
    if not inputs:
        return {}
    found = {j.id: j for j in jobs.get_many(inputs)}
    results: dict[str, bytes] = {}
    left = INPUTS_MAX_BYTES
    for job_id in inputs:
        results[job_id] = _outcome(job, found.get(job_id), job_id, root, left)
        left -= len(results[job_id])
    return results


def _outcome(job: Job, source: Job | None, job_id: str, root: Path, most: int) -> bytes:
    """The outcome job ``job_id`` (``source``, None when it is gone) left for ``job``'s call, of at
    most ``most`` bytes."""
    what = f"job {job_id}, whose result is an argument of {_function(job)}"
    if source is None or source.spec.tenant != job.spec.tenant:
        raise LaunchError(f"{what}: no such job in tenant {job.spec.tenant!r} (removed by retention?)")
    if source.state != JobState.SUCCEEDED:
        raise LaunchError(f"{what}, is {source.state.value}: it must have SUCCEEDED")
    folder = kept_dir(root, job.spec.tenant, job_id)
    kept = read_kept(folder)
    if kept is None or kept.attempt != source.attempt or source.outputs_attempt != source.attempt:
        note = f": {source.outputs_note}" if source.outputs_note else ""
        raise LaunchError(f"{what}, left no kept outputs to read it from{note}")
    fd = _open_outcome(folder)
    if fd is None:
        raise LaunchError(f"{what}, left no outcome in its kept outputs (was it a function's call?)")
    with os.fdopen(fd, "rb") as file:
        if os.fstat(fd).st_size > most:
            raise LaunchError(
                f"the results {_function(job)} takes hold more than {INPUTS_MAX_BYTES} bytes: have the "
                "jobs write large results to their outputs or a mount, and return where they are"
            )
        return file.read(most)


def _open_outcome(folder: Path) -> int | None:
    """The fd of the outcome in the kept outputs ``folder``, a regular file reached through no link;
    None where there is none. Another error (the storage unreachable) is the node's: raised."""
    try:
        top = open_dir(folder / FILES)
        try:
            inner = open_under(top, OUTCOME_PATH[0])
        finally:
            os.close(top)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    try:
        return open_file(inner, OUTCOME_PATH[1], None)
    finally:
        os.close(inner)


def _function(job: Job) -> str:
    return job.spec.call.function if job.spec.call is not None else job.id
