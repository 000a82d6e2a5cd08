"""User and operator commands: submit, jobs, show, logs, wait, cancel, nodes, cordon, uncordon."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.cli import arrays, elastic
from fleet.cli.output import ago, clock, emit_json, iso, size, stamp, table, took
from fleet.client import ArrayHandle, Client
from fleet.errors import CorruptRecord, NotFound, SpecError
from fleet.models import PROFILES, Job, JobArray, JobSpec, JobState, Node, parse_duration

if TYPE_CHECKING:
    from fleet.models import LogLine

EXIT_FOR_STATE = {JobState.SUCCEEDED: 0, JobState.FAILED: 1, JobState.CANCELLED: 6}


def _client(args: argparse.Namespace) -> Client:
    return Client(args.api_url)


def output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "submit", help="queue a job (or a job array: --array); prints its id",
        description="Queue a job, or with --array a job array (one task per index) in one call; "
        "prints its id.",
    )  # fmt: skip
    p.add_argument("-f", "--file", help="job spec YAML/JSON (flags override its fields)")
    p.add_argument("--name")
    p.add_argument("--image", help="container image (default: the fleet's default_image)")
    p.add_argument(
        "--gpus",
        type=elastic.count_or_range,
        help="GPUs of the whole job; more than a node has: "
        "several nodes; a range MIN-MAX (e.g. 1-4) makes it elastic: fleet sizes it (README)",
    )
    p.add_argument(
        "--batch-size",
        type=elastic.count_or_range,
        help="global batch size (FLEET_BATCH_SIZE); "
        "with --gpus MIN-MAX a range (e.g. 128-1024) lets fleet choose it with the GPUs",
    )
    p.add_argument("--profile", help=f"an elastic job's scaling profile: {', '.join(PROFILES)}")
    p.add_argument("--nodes", type=int, help="a multi-node job: this many nodes, one member each")
    p.add_argument("--gpus-per-node", type=int, help="a multi-node job: GPUs of each member")
    p.add_argument("--cpus", type=float)
    p.add_argument("--memory", help="memory limit, e.g. 16g")
    p.add_argument("--shm-size", help="shared memory size, e.g. 2g")
    p.add_argument("--gpu-model", help="only GPUs whose model contains this text, e.g. H100")
    p.add_argument("--min-gpu-memory", help="only GPUs with at least this much memory, e.g. 40g")
    p.add_argument("--priority", type=int, help="higher runs first (-1000..1000, default 0)")
    p.add_argument("--workdir", metavar="DIR", help="ship this directory with the job as its working "
                   "directory (.gitignore, .fleetignore honoured; unchanged: not sent again)")  # fmt: skip
    p.add_argument("--timeout", help="wall-clock limit of each attempt, e.g. 30m, 2h (then FAILED)")
    p.add_argument("--signal-before", help="SIGTERM this long before the limit, SIGKILL at it, e.g. 60s")
    p.add_argument("--requeue-on-timeout", action="store_const", const=True,
                   help="at the limit, requeue (resume from the checkpoint) instead of failing")  # fmt: skip
    p.add_argument("--not-preemptible", dest="preemptible", action="store_const", const=False,
                   help="never preempted while its tenant is within its guarantee")  # fmt: skip
    p.add_argument(
        "--max-attempts", type=int, help="attempts a job may spend on its own failures (default 3)"
    )
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--label", action="append", default=[], metavar="K=V")
    p.add_argument("--tenant")
    p.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="SRC:DST[:rw]",
        help="bind mount (read-only unless :rw); only under the operator's allowed_mounts",
    )
    p.add_argument(
        "--id", dest="job_id",
        help="job id (with --array: the array id) to use; resubmitting the same id and spec is a no-op",
    )  # fmt: skip
    p.add_argument(
        "--array", metavar="INDICES",
        help="submit a job array, one task per index (e.g. 0-9999 or 1,3,5-9): task I is the job ID-I, "
        "gets FLEET_ARRAY_INDEX=I and the labels fleet.array=ID, fleet.array.index=I; prints the array id",
    )  # fmt: skip
    p.add_argument(
        "--max-running", type=int, metavar="K", help="with --array: at most K tasks on nodes at once"
    )
    p.add_argument(
        "--wait", action="store_true",
        help="print the id, wait for the job (every task of an --array) and exit with its result code",
    )  # fmt: skip
    p.add_argument("--follow", action="store_true", help="with --wait: print the job's output as it runs")
    output_option(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    p.set_defaults(handler=submit)

    p = sub.add_parser(
        "jobs", help="list jobs, newest first; a job array is one line with its tasks per state"
    )
    p.add_argument("--state", type=str.upper, choices=[s.value for s in JobState])
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--tenant", help="only this tenant's (operators and admins; a user sees its own)")
    p.add_argument("--user", help="only those this user submitted")
    p.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="only those carrying it (repeat: all)"
    )
    output_option(p)
    p.set_defaults(handler=jobs)

    p = sub.add_parser(
        "show",
        help="one job: spec, state, node, GPUs, attempts and history; or a job array: its tasks per state",
    )
    p.add_argument("job", metavar="ID")
    output_option(p)
    p.set_defaults(handler=show)

    p = sub.add_parser("logs", help="a job's output (latest attempt unless --attempt)")
    p.add_argument("job")
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the attempt ends"
    )
    p.add_argument("--attempt", type=int)
    p.add_argument("--rank", type=int, default=0, help="a multi-node job's member (default 0)")
    p.add_argument(
        "-t", "--timestamps", action="store_true", help="prefix each line with when it was shipped"
    )
    output_option(p)
    p.set_defaults(handler=logs)

    p = sub.add_parser(
        "wait", help="wait for a job (or every task of a job array); exit 0 SUCCEEDED, 1 FAILED, "
        "6 CANCELLED, 4 timeout",
    )  # fmt: skip
    p.add_argument("job", metavar="ID")
    p.add_argument("--timeout", type=float, help="seconds (default: forever)")
    output_option(p)
    p.set_defaults(handler=wait)

    p = sub.add_parser(
        "cancel", help="cancel a job, every task of a job array (--array) or every job with labels (--label)",
        description="Cancel jobs: queued ones at once, running ones are stopped by their agents (their "
        "GPUs freed), then CANCELLED. Give one JOB, --array ID, or one or more --label K=V (the jobs not yet "
        "finished that have all of them).",
    )  # fmt: skip
    p.add_argument("job", nargs="?", metavar="JOB")
    p.add_argument("--array", dest="array_id", metavar="ID", help="every task of this job array")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="every job with this label")
    output_option(p)
    p.set_defaults(handler=cancel)

    p = sub.add_parser("nodes", help="nodes with state, heartbeat and GPUs; `nodes NODE` for one")
    p.add_argument("node", nargs="*", metavar="NODE", help="one node in full (`nodes show NODE` too)")
    output_option(p)
    p.set_defaults(handler=nodes)

    p = sub.add_parser("cordon", help="no new jobs on a node; running jobs are untouched")
    p.add_argument("node")
    p.add_argument("--reason", default="")
    output_option(p)
    p.set_defaults(handler=cordon)

    p = sub.add_parser(
        "drain", help="cordon; jobs may finish until --deadline, then checkpoint (SIGTERM) and move on",
        description="Cordon all NODEs first, then drain them. Running jobs may finish until the deadline; "
        "then each gets SIGTERM and --grace to checkpoint, and is requeued on another node without "
        "spending its retries. With --wait: exit 0 once every node is DRAINED, 4 on --timeout.",
    )  # fmt: skip
    p.add_argument("nodes", nargs="+", metavar="NODE")
    p.add_argument("--deadline", default="1h", help="how long running jobs may finish (e.g. 30m; default 1h)")
    p.add_argument(
        "--grace", default="60s", help="time between SIGTERM and SIGKILL to checkpoint (default 60s)"
    )
    p.add_argument("--force", action="store_true", help="stop running jobs now (they still get --grace)")
    p.add_argument("--wait", action="store_true", help="show progress and wait until DRAINED")
    p.add_argument("--timeout", help="with --wait: give up after this long (exit 4)")
    p.add_argument("--reason", default="")
    output_option(p)
    p.set_defaults(handler=drain)

    p = sub.add_parser("uncordon", help="let a cordoned or drained node take jobs again")
    p.add_argument("node")
    output_option(p)
    p.set_defaults(handler=uncordon)


# -- submit ------------------------------------------------------------------------------


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _mounts(values: list[str]) -> list[dict[str, Any]]:
    mounts = []
    for item in values:
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise SpecError(f"--mount {item!r}: expected SRC:DST or SRC:DST:rw")
        mounts.append({"source": parts[0], "target": parts[1], "read_only": parts[2:] != ["rw"]})
    return mounts


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    data: dict[str, Any] = {}
    if args.file:
        import yaml  # only -f needs it

        try:
            text = Path(args.file).read_text()
        except OSError as exc:
            raise SpecError(f"-f {args.file}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise SpecError(f"-f {args.file}: not a text file (expected job spec YAML or JSON)") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise SpecError(f"-f {args.file}: {problem}{at}") from None
        if not isinstance(loaded, dict):
            raise SpecError(f"{args.file}: expected a mapping of job spec fields")
        data.update(loaded)
    if args.cmd and args.cmd[0] != "--":
        raise SpecError(
            f"{args.cmd[0]!r} follows the options: give the command after --, as in fleet submit --gpus 1 "
            "-- python3 train.py (a value with a space needs quotes)"
        )
    command = args.cmd[1:]
    flags = {
        "name": args.name, "image": args.image, "gpus": args.gpus, "cpus": args.cpus, "memory": args.memory,
        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
        "shm_size": args.shm_size, "gpu_model": args.gpu_model, "min_gpu_memory": args.min_gpu_memory,
        "priority": args.priority, "max_attempts": args.max_attempts, "tenant": args.tenant,
        "preemptible": args.preemptible, "timeout": args.timeout, "signal_before": args.signal_before,
        "requeue_on_timeout": args.requeue_on_timeout, "workdir": args.workdir,
        "batch_size": args.batch_size, "profile": args.profile, "command": command or None,
    }  # fmt: skip
    data.update({k: v for k, v in flags.items() if v is not None})
    data["env"] = {**data.get("env", {}), **_pairs(args.env, "--env")}
    data["labels"] = {**data.get("labels", {}), **_pairs(args.label, "--label")}
    data["mounts"] = [*data.get("mounts", []), *_mounts(args.mount)]
    if "name" not in data and data.get("command"):
        data["name"] = (
            re.sub(r"[^A-Za-z0-9_.-]", "-", Path(str(data["command"][0])).name)[:63].strip("-.") or "job"
        )
    return JobSpec.parse(data)


def submit(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    if args.array is not None:
        return submit_array(args, spec)
    if args.max_running is not None:
        raise SpecError("--max-running: only with --array (it limits the tasks of an array on nodes at once)")
    client = _client(args)
    handle = client.submit(spec, job_id=args.job_id)
    _warn_unplaceable(client, spec)
    if args.wait:
        if args.output != "json":
            print(handle.id, flush=True)
        if args.follow:
            _follow_every_attempt(client, handle.id)
        job = handle.wait()
        _print_job_line(job, args.output)
        return EXIT_FOR_STATE[job.state]
    if args.follow:
        raise SpecError("--follow: only with --wait (fleet logs -f JOB follows a job submitted earlier)")
    if args.output == "json":
        emit_json(handle.status())
    else:
        print(handle.id)
    return 0


def submit_array(args: argparse.Namespace, spec: JobSpec) -> int:
    indices = arrays.indices(args.array, args.max_running)
    client = _client(args)
    handle = client.submit_array(spec, indices, max_running=args.max_running, array_id=args.job_id)
    _warn_unplaceable(client, spec)
    if args.wait:
        return arrays.result(handle.wait(), args.output)
    if args.output == "json":
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


# -- read ---------------------------------------------------------------------------------


def jobs(args: argparse.Namespace) -> int:
    client = _client(args)
    labels = _pairs(args.label, "--label") or None
    found = client.listing(args.state, args.limit, args.tenant, args.user, labels)
    if args.output == "json":
        emit_json(found)
        return 0
    now = time.time()
    rows = [_job_row(j, now) if isinstance(j, Job) else arrays.row(j) for j in found]
    table(
        ["ID", "STATE", "USER", "TENANT", "GPUS", "NODE", "ATTEMPT", "START", "ELAPSED", "EXIT", "REASON"],
        rows,
    )
    _note_quarantined("job", client.quarantined_jobs(), "fleet show ID")
    return 0


def _job_row(j: Job, now: float) -> tuple[object, ...]:
    """A job's line: START and ELAPSED are its latest attempt's (a queued job: since submitted)."""
    start = j.started_at if j.started_at and j.state != JobState.QUEUED else None
    elapsed = took(((j.finished_at or now) if start else now) - (start or j.created_at))
    node = f"{j.node}+{len(j.members) - 1}" if len(j.members) > 1 else j.node
    return (j.id, j.state.value, j.owner or "-", j.spec.tenant, elastic.gpus_cell(j), node, j.attempt,
            clock(start, now), elapsed, j.exit_code, _short(j.reason, 50))  # fmt: skip


def _note_quarantined(kind: str, records: dict[str, str], show: str) -> None:
    if records:
        print(f"fleet: {len(records)} {kind} record(s) unreadable and quarantined, not listed: "
              f"{', '.join(sorted(records))} (`{show}` says why)", file=sys.stderr)  # fmt: skip


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def show(args: argparse.Namespace) -> int:
    client = _client(args)
    job = arrays.job_or_array(client, args.job)
    if isinstance(job, JobArray):
        return arrays.show(job, args.output)
    history = client.history(args.job)
    if args.output == "json":
        emit_json({**job.model_dump(mode="json"), "history": [e.model_dump(mode="json") for e in history]})
        return 0
    spec = job.spec
    print(f"Job:        {job.id}  ({spec.name}, tenant {spec.tenant})")
    print(f"State:      {job.state.value}  {job.reason}{_countdown(job)}")
    print(f"Image:      {spec.image or '(the fleet default_image)'}")
    print(f"Command:    {' '.join(spec.command)}")
    print(f"Resources:  gpus={spec.gpus} cpus={spec.cpus or '-'} memory={size(spec.memory)} "
          f"shm={size(spec.shm_size)} priority={spec.priority}")  # fmt: skip
    elastic.show(job)
    if job.array_id is not None:
        limit = f" (array max running {job.array_max_running})" if job.array_max_running else ""
        print(f"Array:      {job.array_id}, task {job.array_index}{limit}")
    if job.members:
        print(f"Members:    {len(job.members)} nodes, rank 0 at {job.master_addr}:{job.master_port}")
        for rank, (member, phase) in enumerate(zip(job.members, job.member_phases, strict=True)):
            gpus = ", ".join(member.gpus) or "-"
            print(f"  rank {rank}: {member.node}  GPUs {gpus}  {phase or 'not started'}")
    else:
        print(f"Node:       {job.node or '-'}")
        print(f"GPUs:       {', '.join(job.gpus) or '-'}")
    print(f"Attempts:   {job.attempt} (failures {job.failures} of {spec.max_attempts} allowed, "
          f"infrastructure requeues {job.infra_requeues})")  # fmt: skip
    print(f"Exit code:  {job.exit_code if job.exit_code is not None else '-'}")
    print(f"Checkpoint: {job.checkpoint or '-'}")
    if job.state == JobState.QUEUED:
        _print_standing(client, job)
    print("History:")
    table(["  TIME", "STATE", "ATTEMPT", "NODE", "REASON"],
          [(f"  {stamp(e.at)}", e.state, e.attempt, e.node, e.reason) for e in history])  # fmt: skip
    return 0


def _print_standing(client: Client, job: Job) -> None:
    """Where a queued job stands, and its tenant against its share: what a user can act on."""
    where = client.position(job.id)
    if where is not None:
        print(f"Queue:      {_ordinal(where.in_tenant)} of {where.tenant_queued} in tenant {where.tenant}'s "
              f"queue (by priority, then submission); {where.overall - 1} of {where.queued} queued jobs "
              "outrank it overall (tenants take turns by fair share)")  # fmt: skip
    tenant = next((t for t in client.tenants() if t.tenant.name == job.spec.tenant), None)
    if tenant is not None:
        policy = tenant.tenant
        limit = "no limit" if policy.max_gpus is None else f"max {policy.max_gpus}"
        print(f"Tenant:     {policy.name} uses {tenant.gpus_used} GPUs; fair share now "
              f"{tenant.fair_share_gpus:.1f}, guaranteed {policy.guaranteed_gpus}, {limit}, weight "
              f"{policy.weight:g}")  # fmt: skip


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _countdown(job: Job) -> str:
    """Stored reasons hold no countdown (they would change every pass); render it here."""
    left = job.not_before - time.time()
    return f" (next attempt in {left:.0f}s)" if job.state == JobState.QUEUED and left > 0 else ""


def logs(args: argparse.Namespace) -> int:
    client = _client(args)
    lines: Iterable[LogLine] = (
        client.follow_logs(args.job, args.attempt, rank=args.rank) if args.follow
        else client.logs(args.job, args.attempt, args.rank)
    )  # fmt: skip
    for line in lines:
        if args.output == "json":
            record = {"at": line.at, "time": iso(line.at), "attempt": line.attempt, "line": line.line}
            print(json.dumps(record), flush=args.follow)
        else:
            print(f"{iso(line.at)} {line.line}" if args.timestamps else line.line, flush=args.follow)
    return 0


def _follow_every_attempt(client: Client, job_id: str) -> None:
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


def _print_job_line(job: Job, output: str) -> None:
    if output == "json":
        emit_json(job)
    else:
        print(f"{job.id} {job.state.value}: {job.reason}")


def wait(args: argparse.Namespace) -> int:
    client = _client(args)
    found = arrays.job_or_array(client, args.job)
    if isinstance(found, JobArray):
        return arrays.result(ArrayHandle(client, found.id).wait(args.timeout), args.output)
    job = client.wait(args.job, args.timeout)
    _print_job_line(job, args.output)
    return EXIT_FOR_STATE[job.state]


def cancel(args: argparse.Namespace) -> int:
    given = [bool(args.job), bool(args.array_id), bool(args.label)]
    if sum(given) != 1:
        raise SpecError("cancel: give one JOB, or --array ID, or --label K=V (see `fleet cancel --help`)")
    client = _client(args)
    if args.job:
        job = _cancel_one(client, args.job)
        _print_job_line(job, args.output)
        return 0
    if args.array_id:
        report = client.cancel_array(args.array_id)
    else:
        report = client.cancel_labels(_pairs(args.label, "--label"))
    arrays.print_cancelled(report, args.output)
    return 0


def _cancel_one(client: Client, job_id: str) -> Job:
    try:
        return client.cancel(job_id)
    except CorruptRecord:
        raise
    except NotFound as missing:
        arrays.array_or(client, job_id, missing)
        raise NotFound(
            f"{job_id!r} is a job array: cancel its tasks with `fleet cancel --array {job_id}`"
        ) from None


# -- nodes ----------------------------------------------------------------------------------


def nodes(args: argparse.Namespace) -> int:
    client = _client(args)
    names = args.node[1:] if args.node[:1] == ["show"] else args.node
    if args.node[:1] == ["show"] and not names:
        raise SpecError("usage: fleet nodes [show] NODE")
    if len(names) > 1:
        raise SpecError(f"one node at a time: fleet nodes NODE (got {' '.join(names)})")
    if names:
        return _show_node(client.node(names[0]), args.output)
    found = client.nodes()
    if args.output == "json":
        emit_json(found)
        return 0
    rows = [
        (n.name, n.state.value, ago(n.heartbeat_at), f"{len(n.gpus) - _unavailable(n)}/{len(n.gpus)}",
         n.runtime, n.gpu_backend, _short(n.reason, 50))
        for n in found
    ]  # fmt: skip
    table(["NODE", "STATE", "HEARTBEAT", "FREE GPUS", "RUNTIME", "GPU BACKEND", "REASON"], rows)
    for n in found:
        _gpu_rows(n)
    _note_quarantined("node", client.quarantined_nodes(), "fleet nodes show NODE")
    return 0


def _unavailable(node: Node) -> int:
    return sum(1 for g in node.gpus if g.uuid in node.claims or g.busy or not g.healthy)


def _gpu_rows(node: Node) -> None:
    if not node.gpus:
        return
    print(f"\n{node.name}:")
    rows = []
    for g in node.gpus:
        holder = node.claims.get(g.uuid)
        status = f"claimed by {holder}" if holder else g.busy or ("free" if g.healthy else g.health)
        rows.append((f"  {g.index}", g.uuid, g.model, size(g.memory_total), size(g.memory_used), status))
    table(["  IDX", "UUID", "MODEL", "MEMORY", "USED", "STATUS"], rows)


def _show_node(node: Node, output: str) -> int:
    if output == "json":
        emit_json(node)
        return 0
    print(f"Node:      {node.name}")
    print(f"State:     {node.state.value}  {node.reason}")
    print(f"Changed:   {stamp(node.changed_at)} by {node.changed_by or '-'}")
    if node.drain_deadline:
        print(f"Drain:     deadline {stamp(node.drain_deadline)}, grace {node.drain_grace_s:g}s")
    print(f"Jobs:      {', '.join(node.jobs) or '-'}")
    print(f"Heartbeat: {ago(node.heartbeat_at)}")
    print(
        f"Capacity:  {node.cpus} CPUs, {size(node.memory)} memory; "
        f"runtime {node.runtime}, GPUs {node.gpu_backend}"
    )
    _gpu_rows(node)
    return 0


def duration(text: str, flag: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``30min``, ``2h``, ``90d`` (as a job spec's durations)."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise SpecError(f"{flag}: {exc}") from None
    assert seconds is not None
    return seconds


def drain(args: argparse.Namespace) -> int:
    deadline, grace = duration(args.deadline, "--deadline"), duration(args.grace, "--grace")
    timeout = duration(args.timeout, "--timeout") if args.timeout else None
    client = _client(args)
    nodes = client.drain(args.nodes, deadline_s=deadline, grace_s=grace, force=args.force, reason=args.reason)
    if args.wait:
        shown: dict[str, str] = {}

        def progress(now_nodes: list[Node]) -> None:
            for n in now_nodes:
                left = (
                    f"deadline in {max(n.drain_deadline - time.time(), 0):.0f}s" if n.drain_deadline else ""
                )
                line = f"{n.name}: {n.state.value}, {len(n.jobs)} job(s) left" + (f", {left}" if left else "")
                if args.output != "json" and shown.get(n.name, "").split(",")[:2] != line.split(",")[:2]:
                    print(line, flush=True)
                shown[n.name] = line

        nodes = client.wait_drained(args.nodes, timeout, progress)
    if args.output == "json":
        emit_json(nodes)
    else:
        for n in nodes:
            print(f"{n.name}: {n.state.value}" + (f" ({len(n.jobs)} job(s) left)" if n.jobs else ""))
    return 0


def cordon(args: argparse.Namespace) -> int:
    return _show_node(_client(args).cordon(args.node, args.reason), args.output)


def uncordon(args: argparse.Namespace) -> int:
    return _show_node(_client(args).uncordon(args.node), args.output)
