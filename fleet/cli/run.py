"""``fleet run``: submit a job, wait for its node, stream its output and exit with its exit code,
as ``srun`` does; Ctrl-C cancels the job (``submit --wait`` leaves it running)."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.common import CONTEXT, Globals, pass_globals
from fleet.cli.submit import CommandAfterDashes, spec_from_options, submit
from fleet.errors import FleetError, SpecError
from fleet.models import Job, JobSpec, JobState, LogLine

if TYPE_CHECKING:
    from fleet.client import Client

#: how often a job not yet on its node is looked at (its waiting reason printed when it changes)
POLL_S = 0.5
#: the most stdin bytes sent in one call
CHUNK = 64 << 10
#: the runtimes whose nodes give a job forwarded stdin
PIPED = ("process", "docker")
#: submit's options that make no sense for one job whose output is streamed
_NOT_HERE = ("wait", "follow", "array", "max_running", "output")


@click.command(
    cls=CommandAfterDashes,
    context_settings=CONTEXT,
    short_help="submit, wait for a node, stream the output, exit with the job's exit code (srun)",
    epilog="Examples: fleet run --gpus 1 -- nvidia-smi; fleet run --workdir . --gpus 2 -- python3 "
    "train.py; zcat data.gz | fleet run -- python3 count.py. A piped or redirected stdin is forwarded "
    "to the job (up to 16 MiB; the job reads EOF where it ends), a terminal or /dev/null is not (the "
    "job reads an empty stdin): --stdin forwards a terminal too (Ctrl-D ends it), --no-stdin forwards "
    "nothing. Its input is not sent again: a job reading it is not retried after a failure of its own "
    "unless --max-attempts says so (one requeued for its node's fault goes on with what its earlier "
    "attempts did not read). Forwarded stdin needs a job on one node (process or Docker runtime). "
    "The job's stdout and "
    "stderr both come out on stdout; what fleet says itself (waiting reasons, a failure's reason) goes "
    "to stderr.",
)
@click.option(
    "--stdin/--no-stdin",
    "forward",
    default=None,
    help="forward this command's stdin to the job [default: when it is a pipe or a file]",
)
@click.argument("stray", nargs=-1, metavar="-- COMMAND [ARGS]...")
@pass_globals
@click.pass_context
def run(
    ctx: click.Context, globals_: Globals, /, stray: tuple[str, ...], forward: bool | None, **options: Any
) -> int:
    """Submit a job (the options are `fleet submit`'s), wait until a node runs it (saying why it
    waits while it is queued), print its output as it comes, attempt after attempt, and exit with
    its exit code: as `srun` does.

    Ctrl-C cancels the job (unlike `fleet submit --wait`, which leaves it running) and exits 130.
    A job that failed without an exit code of its own (it never started, its node was lost) exits
    1, one that was cancelled 6, with the reason on stderr."""
    if stray:
        raise SpecError(
            f"{stray[0]!r} follows the options: give the command after --, as in fleet run --gpus 1 "
            "-- python3 train.py (a value with a space needs quotes)"
        )
    spec = spec_from_options(options, ctx.meta.get("fleet.command", []))
    client = globals_.client()
    spec = spec.model_copy(update={"stdin": forwarded(forward, spec, client)})
    if spec.stdin and "max_attempts" not in spec.model_fields_set:
        # its input is not sent again: an attempt after a failure of its own would read only the rest
        spec = spec.model_copy(update={"max_attempts": 1})
    handle = client.submit(spec, job_id=options["job_id"])
    if spec.stdin:
        threading.Thread(target=feed, args=(client, handle.id), name="stdin", daemon=True).start()
    try:
        say(f"job {handle.id} submitted (Ctrl-C cancels it)")
        job = stream(client, handle.id)
    except KeyboardInterrupt:
        client.cancel(handle.id)
        say(f"cancelled job {handle.id}", newline=sys.stderr.isatty())
        return 130
    return exit_code(job)


def forwarded(asked: bool | None, spec: JobSpec, client: Client) -> bool:
    """Whether the job reads this command's stdin: as asked, else when it is a pipe or a file (a
    terminal would hold the job waiting for typing; /dev/null has nothing to say), for a job that
    can (one node) in a fleet that can (a node of the process or Docker runtime)."""
    if asked is not None or spec.stdin:  # -f's spec may ask for it
        return bool(asked if asked is not None else spec.stdin)
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):  # no stdin at all
        return False
    one_node = (spec.nodes or 1) == 1 and not spec.elastic
    piped = stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)
    return piped and one_node and any(node.runtime in PIPED for node in client.nodes())


def feed(client: Client, job_id: str) -> None:
    """Send this command's stdin to the job as it comes, then its end; what stops it, on stderr
    (nothing when the job ended: it reads no more)."""
    try:
        while data := os.read(sys.stdin.fileno(), CHUNK):
            client.send_stdin(job_id, data)
        client.send_stdin(job_id, b"", eof=True)
    except FleetError as exc:
        try:
            ended = client.get(job_id).state.final
        except FleetError:
            ended = False
        if not ended:
            say(f"stdin is not forwarded any further: {exc}")
    except OSError as exc:
        say(f"stdin is not forwarded any further: cannot read it ({exc.strerror})")
        with contextlib.suppress(FleetError):
            client.send_stdin(job_id, b"", eof=True)  # the job reads EOF, not a hang


def stream(client: Client, job_id: str) -> Job:
    """Print each attempt's output as it comes and, while the job waits, why; the job once final."""
    shown, reason = 0, ""
    while True:
        job = client.get(job_id)
        # the job's attempt has output unless it is still being placed or started (queued again: ended)
        ran = job.attempt - (job.state in (JobState.SCHEDULED, JobState.STARTING))
        if ran > shown:
            shown += 1
            print_attempt(client, job_id, shown)
            continue
        if job.state.final:
            return job
        if job.reason != reason and job.state != JobState.RUNNING:
            reason = job.reason
            say(f"job {job_id} {job.state.value}: {reason}")
        time.sleep(POLL_S)


def print_attempt(client: Client, job_id: str, attempt: int) -> None:
    """An attempt's output as it comes, then what was shipped after its end was recorded."""
    last = (0, 0)
    for line in client.follow_logs(job_id, attempt):
        print(line.line, flush=True)
        last = _place(line)
    for line in client.logs(job_id, attempt):
        if _place(line) > last:
            print(line.line, flush=True)


def _place(line: LogLine) -> tuple[int, int]:
    """A line's place in its attempt's stream (a Redis stream id, ``ms-seq``)."""
    ms, _, seq = line.id.partition("-")
    return int(ms), int(seq or 0)


def exit_code(job: Job) -> int:
    """The job's own exit code; 1 for a failure without one, 6 for a cancelled job (reason on stderr)."""
    if job.state == JobState.SUCCEEDED:
        return 0
    say(f"job {job.id} {job.state.value}: {job.reason}")
    if job.state == JobState.CANCELLED:
        return 6
    code = job.exit_code or 1
    return 128 - code if code < 0 else min(code, 255)  # killed by signal N: 128+N, as a shell says


def say(text: str, newline: bool = False) -> None:
    print(f"{chr(10) if newline else ''}fleet: {text}", file=sys.stderr, flush=True)


run.params[:0] = [p for p in submit.params if p.name not in (*_NOT_HERE, "stray")]
