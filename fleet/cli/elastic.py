"""Elastic jobs on the command line: ``fleet resize``, the ``--gpus 1-4`` form, their lines in ``show``."""

from __future__ import annotations

import re

import click

from fleet.cli.common import CONTEXT, Globals, output_option, pass_globals
from fleet.cli.output import emit_json
from fleet.cli.view import Field
from fleet.models import LEARN, Job, JobState, Range
from fleet.progress import follows_batch

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*\Z")


@click.command(
    context_settings=CONTEXT,
    short_help="give an elastic job another size: GPUs (within its range), batch size",
)
@click.argument("job")
@click.option("--gpus", type=int, required=True, help="GPUs of the whole job")
@click.option("--batch-size", type=int, help="global batch size (default: scaled with the GPUs)")
@output_option
@pass_globals
def resize(globals_: Globals, job: str, gpus: int, batch_size: int | None, output: str) -> int:
    """Resize an elastic job (one submitted with --gpus MIN-MAX) within its range. A queued job starts
    at the new size; a running one checkpoints on SIGTERM and starts again at it, spending no retry,
    unless only its batch changes and it follows that as it runs (fw.batch_size(follow=True)): then
    it takes the new batch up where it runs. Its owner or an operator may resize it. With the
    controller's elastic step on, fleet may size it again after controller.elastic_min_interval_s."""
    found = globals_.client().resize(job, gpus, batch_size)
    if output == "json":
        emit_json(found)
    else:
        print(f"{found.id} {found.state.value}: {found.reason}")
    return 0


def count_or_range(text: str) -> int | dict[str, int]:
    """``4`` or ``1-4`` (a range: an elastic job's), for ``--gpus`` and ``--batch-size``."""
    match = _RANGE.match(text)
    if match:
        return {"min": int(match[1]), "max": int(match[2])}
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a number, or a range MIN-MAX (e.g. 1-4)") from None


def gpus_cell(job: Job) -> str | int:
    """The GPUS column: a job's count, or an elastic job's current size and range (``2 (1-4)``)."""
    if not isinstance(job.spec.gpus, Range):
        return job.spec.gpus
    return f"{job.num_gpus or '-'} ({job.spec.gpus})"


def fields(job: Job) -> list[Field]:
    """An elastic job's lines in ``fleet show``: its size now, its ranges, its resizes (a plain job's:
    its batch size, when it has one)."""
    spec = job.spec
    if not isinstance(spec.gpus, Range):
        return [] if job.global_batch is None else [Field("Batch size", str(job.global_batch))]
    now = (
        f"{job.num_gpus} GPU{'' if job.num_gpus == 1 else 's'}, batch {job.batch_size}"
        if job.num_gpus
        else "not sized yet"
    )
    going = ""
    if job.resize_gpus is not None:
        going = f"; resizing to {job.resize_gpus} GPUs, batch {job.resize_batch}"
    profile = spec.profile or ""
    ranges = f"gpus {spec.gpus}, batch size {spec.batch_size}, profile {profile[:19]}"  # sha256:<12 hex>
    times = f"resized {job.resizes} time{'' if job.resizes == 1 else 's'}"
    if job.state == JobState.RUNNING and follows_batch(job.progress):
        times += "; its batch changes in place"
    shown = [Field("Elastic", f"{now}{going} ({ranges}); {times}")]
    from fleet.scheduler.goodput import job_goodput  # the profiles' module: only for elastic jobs

    if standing := job_goodput(job):  # what its fw.report(gns=...) said
        shown.append(Field("Goodput", str(standing)))
    if measured := job.measured:  # what its reports said at each size, the learned profile's data
        said = ", ".join(
            f"{g} GPU{'' if g == 1 else 's'} x {b}: {v:,.4g}/s" for (g, b), v in measured.items()
        )
        shown.append(Field("Samples/s", said))
    elif profile == LEARN and job.state.on_node:
        shown.append(
            Field(
                "Samples/s", "none reported yet: it stays at its size until it calls fw.report(samples=...)"
            )
        )
    return shown
