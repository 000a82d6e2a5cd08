"""``fleet result JOB``: what a function job (``fleet.function``) returned, as its repr, or as JSON
(``-o json``) when it is JSON-serialisable; of a map's task of several calls (``chunksize``), their
values as one list, or the first exception (a note names its item). The outcome is unpickled here,
in the caller's own process, as ``result()`` does: a value of a class defined in the function's
module needs that module importable here (run it from the project's directory)."""

from __future__ import annotations

import json
import os
import sys
import traceback

import click

from fleet.cli.common import CONTEXT, Globals, complete_jobs, job_goes_on, output_option, pass_globals
from fleet.client.outcomes import FunctionHandle
from fleet.errors import FleetError, SpecError


@click.command(
    context_settings=CONTEXT,
    short_help="what a function job returned (its repr, or -o json); its exception, exit 1",
)
@click.argument("job", metavar="ID", shell_complete=complete_jobs)
@click.option("--timeout", type=float, help="seconds to wait for the job to end (default: forever)")
@output_option
@pass_globals
def result(globals_: Globals, job: str, timeout: float | None, output: str) -> int:
    """Wait for a function job to end and print what it returned: its repr, or JSON with -o json
    (a map's task of several calls: their values, one list). The function's exception is printed
    with the node's traceback, exit 1; a job that ended without a result (cancelled, a time limit)
    exits as ``fleet wait`` does."""
    # the classes of what it returned or raised are found as the caller's script finds them: from
    # the directory it runs in first (a console script's sys.path starts with its bin directory)
    sys.path.insert(0, os.getcwd())
    client = globals_.client()
    found = client.get(job)
    if found.spec.call is None:
        raise SpecError(
            f"job {job} is not a function's call (fleet.function): it has no result; see fleet logs {job}"
        )
    handle: FunctionHandle[object] = FunctionHandle(client, found.id, found.spec.call.function)
    with job_goes_on(found.id):
        try:
            value = handle.result(timeout)
        except FleetError:
            raise
        except Exception as exc:  # the function's own exception, with the node's traceback in its note
            print("".join(traceback.format_exception_only(exc)).rstrip(), file=sys.stderr)
            for note in getattr(exc, "__notes__", []):
                print(note, file=sys.stderr)
            return 1
    if output == "json":
        try:
            print(json.dumps(value, indent=2))
        except (TypeError, ValueError) as exc:
            raise SpecError(
                f"-o json: job {found.id}'s result is not JSON-serialisable ({exc}); print its repr "
                "(leave out -o json)"
            ) from None
    else:
        print(repr(value))
    return 0
