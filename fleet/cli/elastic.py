"""Elastic jobs on the command line: ``fleet resize``, the ``--gpus 1-4`` form, their lines in ``show``."""

from __future__ import annotations

import argparse
import re
from typing import Any

from fleet.cli.output import emit_json
from fleet.client import Client
from fleet.models import Job, Range

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def register(sub: Any, output_option: Any) -> None:
    p = sub.add_parser(
        "resize", help="give an elastic job another size: GPUs (within its range) and batch size",
        description="Resize an elastic job (one submitted with --gpus MIN-MAX) within its range. A queued "
        "job starts at the new size; a running one checkpoints on SIGTERM and starts again at it, spending "
        "no retry. Its owner or an operator may resize it. With the controller's elastic step on, fleet "
        "may size it again after controller.elastic_min_interval_s.",
    )  # fmt: skip
    p.add_argument("job", metavar="JOB")
    p.add_argument("--gpus", type=int, required=True, help="GPUs of the whole job")
    p.add_argument("--batch-size", type=int, help="global batch size (default: scaled with the GPUs)")
    output_option(p)
    p.set_defaults(handler=resize)


def count_or_range(text: str) -> int | dict[str, int]:
    """``4`` or ``1-4`` (a range: an elastic job's), for ``--gpus`` and ``--batch-size``."""
    match = _RANGE.match(text)
    if match:
        return {"min": int(match[1]), "max": int(match[2])}
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a number, or a range MIN-MAX (e.g. 1-4)"
        ) from None


def resize(args: argparse.Namespace) -> int:
    job = Client(args.api_url).resize(args.job, args.gpus, args.batch_size)
    if args.output == "json":
        emit_json(job)
    else:
        print(f"{job.id} {job.state.value}: {job.reason}")
    return 0


def gpus_cell(job: Job) -> str | int:
    """The GPUS column: a job's count, or an elastic job's current size and range (``2 (1-4)``)."""
    if not isinstance(job.spec.gpus, Range):
        return job.spec.gpus
    return f"{job.num_gpus or '-'} ({job.spec.gpus})"


def show(job: Job) -> None:
    """An elastic job's lines in ``fleet show``: its size now, its ranges, its resizes."""
    spec = job.spec
    if not isinstance(spec.gpus, Range):
        if job.global_batch is not None:
            print(f"Batch size: {job.global_batch}")
        return
    now = f"{job.num_gpus} GPUs, batch {job.batch_size}" if job.num_gpus else "not sized yet"
    going = ""
    if job.resize_gpus is not None:
        going = f"; resizing to {job.resize_gpus} GPUs, batch {job.resize_batch}"
    ranges = f"gpus {spec.gpus}, batch size {spec.batch_size}, profile {spec.profile}"
    print(f"Elastic:    {now}{going} ({ranges}); resized {job.resizes} time{'' if job.resizes == 1 else 's'}")
