"""``fleet submit``: queue a job or a job array, from flags and/or a spec file."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet.cli import arrays
from fleet.cli.common import CONTEXT, Globals, job_goes_on, pairs, pass_globals
from fleet.cli.elastic import count_or_range
from fleet.cli.output import emit_json
from fleet.cli.shipping import shipped_on_terminal
from fleet.errors import SpecError
from fleet.models import PROFILES, Job, JobSpec, JobState, check_job_id

if TYPE_CHECKING:
    from fleet.client import Client

EXIT_FOR_STATE = {JobState.SUCCEEDED: 0, JobState.FAILED: 1, JobState.CANCELLED: 6}


class CommandAfterDashes(click.Command):
    """Options, then ``--``, then the job's command, untouched: what follows ``--`` is never read as
    an option of fleet's; a word before it (``--memory 16 gigs``) is an error, not the command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            args, ctx.meta["fleet.command"] = args[:at], args[at + 1 :]
        return super().parse_args(ctx, args)


@click.command(
    cls=CommandAfterDashes,
    context_settings=CONTEXT,
    short_help="queue a job (or a job array: --array); prints its id",
    epilog="Examples: fleet submit --gpus 2 --memory 32g -- python3 train.py; fleet submit -f job.yaml "
    "--priority 10; fleet submit --wait --follow --workdir . -- python3 train.py",
)
@click.option("-f", "--file", metavar="FILE", help="job spec YAML/JSON (flags override its fields)")
@click.option("--name", help="the job's name (default: the command's)")
@click.option("--image", help="container image (default: the fleet's default_image)")
@click.option(
    "--gpus",
    metavar="N|MIN-MAX",
    type=count_or_range,
    help="GPUs of the whole job; more than a node has: several nodes; a range MIN-MAX (e.g. 1-4) makes it "
    "elastic: fleet sizes it (README)",
)
@click.option(
    "--batch-size",
    metavar="N|MIN-MAX",
    type=count_or_range,
    help="global batch size (FLEET_BATCH_SIZE); a range lets an elastic job's batch follow its GPUs",
)
@click.option(
    "--max-batch-per-gpu",
    type=int,
    metavar="N",
    help="an elastic job's largest per-GPU batch that fits a GPU (with --profile learn: lets fleet try it)",
)
@click.option(
    "--profile",
    metavar="NAME|learn|DIR",
    help=f"an elastic job's scaling profile: {', '.join(PROFILES)}; 'learn' (from its fw.report calls); or "
    "a directory in the profiles format, uploaded (write it with a '/': ./my-model)",
)
@click.option("--nodes", type=int, help="a multi-node job: this many nodes, one member each")
@click.option("--gpus-per-node", type=int, help="a multi-node job: GPUs of each member")
@click.option("--cpus", type=float, help="CPUs, e.g. 4 or 0.5")
@click.option("--memory", metavar="SIZE", help="memory limit, e.g. 16g, 16GiB, 512m")
@click.option("--shm-size", metavar="SIZE", help="shared memory size, e.g. 2g")
@click.option("--gpu-model", help="only GPUs whose model contains this text, e.g. H100")
@click.option("--min-gpu-memory", metavar="SIZE", help="only GPUs with at least this much memory, e.g. 40g")
@click.option("--priority", type=int, help="higher runs first (-1000..1000, default 0)")
@click.option(
    "--workdir",
    metavar="DIR",
    help="ship this directory with the job as its working "
    "directory (.gitignore, .fleetignore honoured; unchanged: not packed or sent again)",
)
@click.option(
    "--outputs",
    metavar="DIR",
    help="keep this directory (relative to the working directory; default outputs) when each attempt "
    "ends, for `fleet download`",
)
@click.option(
    "--timeout", metavar="DURATION", help="wall-clock limit of each attempt, e.g. 30m, 2h (then FAILED)"
)
@click.option(
    "--signal-before", metavar="DURATION", help="SIGTERM this long before the limit, SIGKILL at it, e.g. 60s"
)
@click.option(
    "--requeue-on-timeout",
    is_flag=True,
    default=None,
    help="at the limit, requeue (resume from the checkpoint) instead of failing",
)
@click.option(
    "--not-preemptible",
    "preemptible",
    flag_value=False,
    default=None,
    help="never preempted while its tenant is within its guarantee",
)
@click.option(
    "--allow-unplaceable",
    is_flag=True,
    default=None,
    help="queue it even if no registered node could ever hold it (for a node not registered yet)",
)
@click.option("--max-attempts", type=int, help="attempts a job may spend on its own failures (default 3)")
@click.option(
    "--notify", metavar="URL", help="POST here when the job ends (signed JSON; see README Webhooks)"
)
@click.option("--env", multiple=True, metavar="K=V", help="an environment variable of the job (repeat)")
@click.option("--label", multiple=True, metavar="K=V", help="a label, for fleet jobs/cancel --label (repeat)")
@click.option("--tenant", help="the tenant it runs for (default: your token's)")
@click.option(
    "--after",
    multiple=True,
    metavar="JOB[:ok|:any|:notok]",
    help="wait until this job (or array) succeeded, ended, or failed (repeat)",
)
@click.option(
    "--mount",
    multiple=True,
    metavar="SRC:DST[:rw]",
    help="bind mount (read-only unless :rw); only under the operator's allowed_mounts",
)
@click.option(
    "--id",
    "job_id",
    metavar="ID",
    help="job id (with --array: the array id) to use; resubmitting the same id and spec is a no-op",
)
@click.option(
    "--array",
    metavar="INDICES",
    help="submit a job array, one task per index (e.g. 0-9999 or 1,3,5-9): task I is the job ID-I, "
    "gets FLEET_ARRAY_INDEX=I and the labels fleet.array=ID, fleet.array.index=I; prints the array id",
)
@click.option("--max-running", type=int, metavar="K", help="with --array: at most K tasks on nodes at once")
@click.option(
    "--wait",
    is_flag=True,
    help="print the id, wait for the job (every task of an --array) and exit with its result code; "
    "Ctrl-C stops waiting, the job goes on (fleet run: Ctrl-C cancels)",
)
@click.option("--follow", is_flag=True, help="with --wait: print the job's output as it runs")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="json: the job's record (with --wait: when it ends)",
)
@click.argument("stray", nargs=-1, metavar="-- COMMAND [ARGS]...")
@pass_globals
@click.pass_context
def submit(ctx: click.Context, globals_: Globals, /, stray: tuple[str, ...], **options: Any) -> int:
    """Queue a job, or with --array a job array (one task per index) in one call; prints its id.

    The job's command follows `--`: everything after it is the command, untouched."""
    if stray:
        raise SpecError(
            f"{stray[0]!r} follows the options: give the command after --, as in fleet submit --gpus 1 "
            "-- python3 train.py (a value with a space needs quotes)"
        )
    spec = spec_from_options(options, ctx.meta.get("fleet.command", []))
    if options["array"] is not None:
        return submit_array(globals_, spec, options)
    if options["max_running"] is not None:
        raise SpecError("--max-running: only with --array (it limits the tasks of an array on nodes at once)")
    if options["follow"] and not options["wait"]:
        raise SpecError("--follow: only with --wait (fleet logs -f JOB follows a job submitted earlier)")
    if options["job_id"] is not None:
        check_job_id(options["job_id"])  # before a shipped directory is uploaded
    client = globals_.client()
    handle = client.submit(shipped_on_terminal(client, spec), job_id=options["job_id"])
    _warn_unplaceable(client, spec)
    if options["wait"]:
        with job_goes_on(handle.id):
            if options["output"] != "json":
                print(handle.id, flush=True)
            if options["follow"]:
                follow_every_attempt(client, handle.id)
            job = handle.wait()
        print_job_line(job, options["output"])
        return EXIT_FOR_STATE[job.state]
    if options["output"] == "json":
        emit_json(handle.status())
    else:
        print(handle.id)
    return 0


#: the flags that are a spec's fields of the same name
SPEC_FLAGS = (
    "name",
    "image",
    "gpus",
    "cpus",
    "memory",
    "nodes",
    "gpus_per_node",
    "shm_size",
    "gpu_model",
    "min_gpu_memory",
    "priority",
    "max_attempts",
    "tenant",
    "preemptible",
    "timeout",
    "signal_before",
    "requeue_on_timeout",
    "workdir",
    "outputs",
    "notify",
    "batch_size",
    "profile",
    "max_batch_per_gpu",
    "allow_unplaceable",
)


def spec_from_options(options: dict[str, Any], command: list[str]) -> JobSpec:
    """The job spec: ``-f``'s file, then the flags given over it, then the command after ``--``."""
    data: dict[str, Any] = _read_file(options["file"]) if options.get("file") else {}
    flags = {k: options.get(k) for k in SPEC_FLAGS}
    data.update({k: v for k, v in flags.items() if v is not None})
    if command:
        data["command"] = command
    data["env"] = {**data.get("env", {}), **pairs(options.get("env", ()), "--env")}
    data["labels"] = {**data.get("labels", {}), **pairs(options.get("label", ()), "--label")}
    data["mounts"] = [*data.get("mounts", []), *_mounts(options.get("mount", ()))]
    data["after"] = [*data.get("after", []), *options.get("after", ())]
    if "name" not in data and data.get("command"):
        data["name"] = (
            re.sub(r"[^A-Za-z0-9_.-]", "-", Path(str(data["command"][0])).name)[:63].strip("-.") or "job"
        )
    return JobSpec.parse(data)


def _read_file(path: str) -> dict[str, Any]:
    import yaml  # only -f needs it

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"-f {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"-f {path}: not a text file (expected job spec YAML or JSON)") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"-f {path}: {problem}{at}") from None
    if not isinstance(loaded, dict):
        raise SpecError(f"{path}: expected a mapping of job spec fields")
    return loaded


def _mounts(values: tuple[str, ...]) -> list[dict[str, Any]]:
    mounts = []
    for item in values:
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise SpecError(f"--mount {item!r}: expected SRC:DST or SRC:DST:rw")
        mounts.append({"source": parts[0], "target": parts[1], "read_only": parts[2:] != ["rw"]})
    return mounts


def submit_array(globals_: Globals, spec: JobSpec, options: dict[str, Any]) -> int:
    indices = arrays.indices(options["array"], options["max_running"])  # checked before connecting
    client = globals_.client()
    handle = client.submit_array(
        shipped_on_terminal(client, spec),
        indices,
        max_running=options["max_running"],
        array_id=options["job_id"],
    )
    _warn_unplaceable(client, spec)
    if options["wait"]:
        with job_goes_on(handle.id, array=True):
            done = handle.wait()
        return arrays.result(done, options["output"])
    if options["output"] == "json":
        emit_json(handle.status())
    else:
        print(handle.id)
    return 0


def _warn_unplaceable(client: Client, spec: JobSpec) -> None:
    """Say so when no live node could hold one member: a job larger than every node runs on several
    (one member each, see the README), but not with members larger than any node."""
    if not spec.min_gpus:
        return
    largest = client.most_gpus()
    per_node = spec.gpus_per_node or (spec.min_gpus // spec.nodes if spec.nodes else 1)
    if per_node > largest or not largest:
        print(
            f"fleet: warning: no live node has {per_node} GPUs (largest: {largest}); "
            "the job stays QUEUED until one joins (`fleet show` says why)",
            file=sys.stderr,
        )


def follow_every_attempt(client: Client, job_id: str) -> None:
    """Print each attempt's output as it comes, attempt after attempt, until the job is final."""
    attempt = 0
    while True:
        job = client.get(job_id)
        if job.attempt > attempt:
            attempt = job.attempt
            for line in client.follow_logs(job_id, attempt):
                print(line.line, flush=True)
        elif job.state.final:
            return
        else:
            time.sleep(0.5)


def print_job_line(job: Job, output: str) -> None:
    if output == "json":
        emit_json(job)
    else:
        print(f"{job.id} {job.state.value}: {job.reason}")
