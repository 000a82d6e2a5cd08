"""Nodes: ``fleet nodes``, ``cordon``, ``uncordon``, ``drain``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from fleet.cli.common import (
    CONTEXT,
    Globals,
    complete_nodes,
    duration,
    output_option,
    pass_globals,
    watch_option,
)
from fleet.cli.jobs import note_quarantined, short
from fleet.cli.output import emit_json, present
from fleet.cli.view import Field, Table, View
from fleet.errors import Forbidden, NotFound, SpecError
from fleet.models import Gpu, Node, NodeState, RedisStatus
from fleet.text import ago, redis_line, size, stamp
from fleet.versions import shown

if TYPE_CHECKING:
    from fleet.client import Client

NODE_HEADERS = ["NODE", "STATE", "HEARTBEAT", "FREE GPUS", "RUNTIME", "GPU BACKEND", "VERSION", "REASON"]


@click.command(
    context_settings=CONTEXT, short_help="nodes with state, heartbeat and GPUs; `nodes NODE` for one"
)
@click.argument("node", nargs=-1, metavar="[NODE]", shell_complete=complete_nodes)
@click.option(
    "--redis",
    "redis_only",
    is_flag=True,
    help="only the Redis line: primary, replicas and their lag, sentinels, failovers (-o json: all of it)",
)
@watch_option
@output_option
@pass_globals
def nodes(
    globals_: Globals, node: tuple[str, ...], redis_only: bool, watch: float | None, output: str
) -> int:
    """Nodes with their state, heartbeat, GPUs (free, claimed by which job attempt, or why not
    placeable) and agent's release; `fleet nodes NODE` (or `fleet nodes show NODE`) shows one in full.
    A fleet whose services run different releases says so: `mixed versions: ...` (README, "Upgrading").
    Operators also see which Redis is primary, its replicas' lag, the sentinels that agree and the
    failovers seen (`redis: ...`; --redis for that alone, -o json for its fields)."""
    client = globals_.client()
    if redis_only:
        return present(lambda: redis_frame(client, output), watch, output)
    names = node[1:] if node[:1] == ("show",) else node
    if node[:1] == ("show",) and not names:
        raise SpecError("usage: fleet nodes [show] NODE")
    if len(names) > 1:
        raise SpecError(f"one node at a time: fleet nodes NODE (got {' '.join(names)})")
    if names:
        return present(lambda: node_frame(client.node(names[0]), output), watch, output)

    def frame() -> View | list[Node]:
        found = client.nodes()
        if output == "json":
            return found
        rows = [
            (
                n.name,
                n.state.value,
                ago(n.heartbeat_at),
                f"{free_gpus(n)}/{len(n.gpus)}",
                n.runtime,
                n.gpu_backend,
                shown(n.version),
                short(n.reason, 50),
            )
            for n in found
        ]
        view = View([Table(NODE_HEADERS, rows, wide=7, optional=(6,))])
        for note in (mixed_versions(client), redis_note(client)):
            if note:
                view.add(note)
        for n in found:
            gpu_table(n, view)
        note_quarantined("node", client.quarantined_nodes(), "fleet nodes show NODE")
        return view

    return present(frame, watch, output)


def mixed_versions(client: Client) -> str:
    """``mixed versions: ...`` when the API, the leading controller and the live nodes do not all run
    one release, else "" (also from an API of 0.1.0, which cannot tell)."""
    try:
        return client.versions().mixed
    except NotFound:
        return ""


def redis_note(client: Client) -> str:
    """``redis: primary ..., N replicas ...`` for an operator; "" for a user (it names hosts) and from
    an API of a release without it."""
    try:
        return redis_line(client.redis_status(), time.time())
    except (Forbidden, NotFound):
        return ""


def redis_frame(client: Client, output: str) -> View | RedisStatus:
    status = client.redis_status()
    return status if output == "json" else View([redis_line(status, time.time())])


def placeable(node: Node) -> bool:
    """New jobs may go there: a cordoned, draining, drained or down node takes none."""
    return node.alive and node.state == NodeState.READY


def free_gpus(node: Node) -> int:
    return sum(1 for g in node.gpus if gpu_status(node, g) == "free")


def gpu_status(node: Node, gpu: Gpu) -> str:
    """``free``, ``claimed by JOB:ATTEMPT``, why it is not placeable (``lost``, ``busy: ...``), or
    ``not placeable: node DRAINED`` for a GPU that is fine on a node that takes no jobs."""
    holder = node.claims.get(gpu.uuid)
    if holder:
        return f"claimed by {holder}"
    if gpu.busy or not gpu.healthy:
        return gpu.busy or gpu.health
    return "free" if placeable(node) else f"not placeable: node {node.state.value}"


def gpu_table(node: Node, view: View) -> None:
    if node.gpus:
        rows = [
            (g.index, g.uuid, g.model, size(g.memory_total), size(g.memory_used), gpu_status(node, g))
            for g in node.gpus
        ]
        headers = ["IDX", "UUID", "MODEL", "MEMORY", "USED", "STATUS"]
        view.add(Table(headers, rows, title=node.name, indent=2, wide=1))


def node_frame(node: Node, output: str) -> View | Node:
    if output == "json":
        return node
    view = View(
        [
            Field("Node", node.name),
            Field("State", f"{node.state.value}  {node.reason}", state=True),
            Field("Changed", f"{stamp(node.changed_at)} by {node.changed_by or '-'}"),
        ],
        label_width=11,
    )
    if node.drain_deadline:
        view.add(Field("Drain", f"deadline {stamp(node.drain_deadline)}, grace {node.drain_grace_s:g}s"))
    view.add(Field("Jobs", ", ".join(node.jobs) or "-")).add(Field("Heartbeat", ago(node.heartbeat_at)))
    view.add(
        Field(
            "Capacity",
            f"{node.cpus} CPUs, {size(node.memory)} memory; runtime {node.runtime}, GPUs {node.gpu_backend}",
        )
    )
    view.add(Field("Version", shown(node.version)))
    gpu_table(node, view)
    return view


def _show_node(node: Node, output: str) -> int:
    return present(lambda: node_frame(node, output), None, output)


@click.command(context_settings=CONTEXT, short_help="no new jobs on a node; running jobs are untouched")
@click.argument("node", shell_complete=complete_nodes)
@click.option("--reason", default="", help="why, shown by fleet nodes")
@output_option
@pass_globals
def cordon(globals_: Globals, node: str, reason: str, output: str) -> int:
    """No new jobs on a node; running jobs are untouched."""
    return _show_node(globals_.client().cordon(node, reason), output)


@click.command(context_settings=CONTEXT, short_help="let a cordoned or drained node take jobs again")
@click.argument("node", shell_complete=complete_nodes)
@output_option
@pass_globals
def uncordon(globals_: Globals, node: str, output: str) -> int:
    """Let a cordoned or drained node take jobs again."""
    return _show_node(globals_.client().uncordon(node), output)


@click.command(
    context_settings=CONTEXT,
    short_help="cordon; jobs may finish until --deadline, then checkpoint (SIGTERM) and move on",
)
@click.argument("names", nargs=-1, required=True, metavar="NODE...", shell_complete=complete_nodes)
@click.option(
    "--deadline", default="1h", show_default=True, help="how long running jobs may finish (e.g. 30m)"
)
@click.option(
    "--grace", default="60s", show_default=True, help="time between SIGTERM and SIGKILL to checkpoint"
)
@click.option("--force", is_flag=True, help="stop running jobs now (they still get --grace)")
@click.option("--wait", is_flag=True, help="show progress and wait until DRAINED")
@click.option("--timeout", metavar="DURATION", help="with --wait: give up after this long (exit 4)")
@click.option("--reason", default="", help="why, shown by fleet nodes")
@output_option
@pass_globals
def drain(
    globals_: Globals,
    names: tuple[str, ...],
    deadline: str,
    grace: str,
    force: bool,
    wait: bool,
    timeout: str | None,
    reason: str,
    output: str,
) -> int:
    """Cordon all NODEs first, then drain them. Running jobs may finish until the deadline; then each
    gets SIGTERM and --grace to checkpoint, and is requeued on another node without spending its
    retries. With --wait: exit 0 once every node is DRAINED, 4 on --timeout."""
    deadline_s, grace_s = duration(deadline, "--deadline"), duration(grace, "--grace")
    timeout_s = duration(timeout, "--timeout") if timeout else None
    client = globals_.client()
    found = client.drain(list(names), deadline_s=deadline_s, grace_s=grace_s, force=force, reason=reason)
    if wait:
        shown: dict[str, str] = {}

        def progress(now_nodes: list[Node]) -> None:
            for n in now_nodes:
                left = (
                    f"deadline in {max(n.drain_deadline - time.time(), 0):.0f}s" if n.drain_deadline else ""
                )
                line = f"{n.name}: {n.state.value}, {len(n.jobs)} job(s) left" + (f", {left}" if left else "")
                if output != "json" and shown.get(n.name, "").split(",")[:2] != line.split(",")[:2]:
                    print(line, flush=True)
                shown[n.name] = line

        found = client.wait_drained(list(names), timeout_s, progress)
    if output == "json":
        emit_json(found)
    else:
        for n in found:
            print(f"{n.name}: {n.state.value}" + (f" ({len(n.jobs)} job(s) left)" if n.jobs else ""))
    return 0
