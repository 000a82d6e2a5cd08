"""The controller's reconcile: which jobs on nodes, nodes and GPU claims need the controller.

A pure function of a snapshot, in the manner of Nomad's ``reconcile_node.go``: it sorts every
job bound to a node into exactly one bucket and every claim into orphan or held, and returns
the buckets; the controller service executes them (each write fenced by the leader token and
by the job's attempt and state, so a bucket computed from a slightly old snapshot changes
nothing that moved on meanwhile).

- ``requeue_lost``: the job's node is gone (lease expired) or has no record at all.
- ``timeouts``: SCHEDULED or STARTING for longer than the launch deadlines on a live node.
- ``drain_stops``: on a DRAINING node past its deadline and not yet asked to stop.
- ``drained``: DRAINING nodes with no job left on them.
- ``orphan_claims``: GPU claims whose ``job:attempt`` is not the current attempt of a job on a node.
- ``ignore``: every other job on a node, left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet.config_sections import ControllerSettings
from fleet.models import Exit, ExitKind, Fault, Job, JobState, Node, NodeState


@dataclass(frozen=True)
class Requeue:
    """Requeue ``job`` at its current attempt and state, as the infrastructure fault ``exit``."""

    job: Job
    exit: Exit
    #: the node is alive: tell its agent to stop the attempt (it may still start or run it)
    stop: bool


@dataclass(frozen=True)
class DrainStop:
    """Ask ``job`` to checkpoint and leave its draining node within ``grace_s``."""

    job: Job
    reason: str
    grace_s: float


@dataclass(frozen=True)
class Buckets:
    requeue_lost: tuple[Requeue, ...] = ()
    timeouts: tuple[Requeue, ...] = ()
    drain_stops: tuple[DrainStop, ...] = ()
    drained: tuple[str, ...] = ()
    #: (GPU uuid, the "job:attempt" that holds it)
    orphan_claims: tuple[tuple[str, str], ...] = ()
    #: ids of jobs on nodes that need nothing
    ignore: tuple[str, ...] = ()


def reconcile(
    nodes: Sequence[Node], jobs: Sequence[Job], claims: Mapping[str, str], now: float, cfg: ControllerSettings
) -> Buckets:
    """Sort ``jobs`` (those not bound to a node are left out), ``nodes`` and ``claims`` into buckets."""
    by_name = {n.name: n for n in nodes}
    on_node = [j for j in jobs if j.state.on_node]
    lost: list[Requeue] = []
    timeouts: list[Requeue] = []
    drains: list[DrainStop] = []
    ignore: list[str] = []
    for job in on_node:
        action = _classify(job, [(n, by_name.get(n)) for n in job.nodes_held or [""]], now, cfg)
        if isinstance(action, DrainStop):
            drains.append(action)
        elif action is None:
            ignore.append(job.id)
        else:
            (timeouts if action.exit.kind == ExitKind.LAUNCH_TIMEOUT else lost).append(action)
    occupied = {n for j in on_node for n in j.nodes_held}
    held = {f"{j.id}:{j.attempt}" for j in on_node}
    return Buckets(
        requeue_lost=tuple(lost),
        timeouts=tuple(timeouts),
        drain_stops=tuple(drains),
        drained=tuple(
            n.name for n in nodes if n.admin_state == NodeState.DRAINING and n.name not in occupied
        ),
        orphan_claims=tuple((uuid, owner) for uuid, owner in sorted(claims.items()) if owner not in held),
        ignore=tuple(ignore),
    )


def _classify(
    job: Job, nodes: list[tuple[str, Node | None]], now: float, cfg: ControllerSettings
) -> Requeue | DrainStop | None:
    """``nodes``: the job's node, or every member's node (a multi-node job), each as stored; one
    lost or drained member node moves the whole job."""
    for name, node in nodes:
        if node is None:
            return Requeue(job, _lost(f"node {name} has no record"), stop=False)
        if not node.alive:
            return Requeue(job, _lost(f"node {name} down (lease expired)"), stop=False)
    late = _late(job, now, cfg)
    if late:
        return Requeue(job, Exit(fault=Fault.INFRA, kind=ExitKind.LAUNCH_TIMEOUT, reason=late), stop=True)
    for _, node in nodes:
        if node is not None and _drain_due(node, now) and not job.preempt:
            return DrainStop(job, f"node {node.name} drained", node.drain_grace_s)
    return None


def _lost(reason: str) -> Exit:
    return Exit(fault=Fault.INFRA, kind=ExitKind.NODE_DOWN, reason=reason)


def _late(job: Job, now: float, cfg: ControllerSettings) -> str:
    """Why the job's launch is over its deadline, or ''."""
    limits = {
        JobState.SCHEDULED: ("scheduled_timeout_s", cfg.scheduled_timeout_s),
        JobState.STARTING: ("starting_timeout_s", cfg.starting_timeout_s),
    }
    if job.state not in limits:
        return ""
    name, limit = limits[job.state]
    waited = now - job.state_since
    if waited <= limit:
        return ""
    return f"launch timed out: {job.state.value} on {job.node} for {waited:.0f}s ({name} = {limit:g})"


def _drain_due(node: Node, now: float) -> bool:
    deadline = node.drain_deadline
    return node.admin_state == NodeState.DRAINING and deadline is not None and now >= deadline
