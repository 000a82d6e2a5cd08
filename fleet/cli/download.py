"""``fleet download``: a job's kept outputs, or one of its checkpoints, into a local directory."""

from __future__ import annotations

import click

from fleet.cli.common import CONTEXT, Globals, pass_globals


@click.command(
    context_settings=CONTEXT,
    short_help="fetch a job's kept outputs (or --checkpoint latest) into ./JOB or -o DIR",
)
@click.argument("job")
@click.argument("path", required=False)
@click.option(
    "-o", "--into", "into", metavar="DIR", help="where the files go (default: ./JOB); made if missing"
)
@click.option(
    "--checkpoint",
    metavar="NAME",
    help="fetch one of its checkpoints instead: 'latest' or a checkpoint's file name",
)
@click.option("--force", is_flag=True, help="replace files that are there already")
@pass_globals
def download(
    globals_: Globals, job: str, path: str | None, into: str | None, checkpoint: str | None, force: bool
) -> int:
    """Fetch what JOB kept: the files its latest attempt left in its outputs directory (spec `outputs`,
    `fleet submit --outputs DIR`, default outputs/ of its working directory), or only those under PATH
    in it; with --checkpoint, one of its checkpoints. Kept whatever way an attempt ended, until the
    job is deleted (job_retention_s), within the tenant's outputs quota (`fleet show` says what is
    kept). Nothing is overwritten without --force. Prints each file written."""
    for written in globals_.client().download(job, path, into, checkpoint=checkpoint, force=force):
        print(written)
    return 0
