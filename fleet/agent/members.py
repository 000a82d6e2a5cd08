"""How one member of a multi-node job failing ends the attempt (the agent's, and the node simulator's
in bench/ through the same function).

A member whose peer's node died fails at once (connection reset), seconds before that node's lease
runs out: not its fault. So it waits, up to a lease TTL, for a peer to explain it: a peer's node
losing its lease makes it an infrastructure fault; the attempt ended by someone else (a peer's own
failure, the controller) leaves nothing to decide. Each failing member records it (phase ``failed``):
once every member has, no node died (a dead node's member records nothing), so the job failed by
itself and nobody waits out the TTL.
"""

from __future__ import annotations

import threading
import time

from fleet.models import Exit, ExitKind, Fault, Job, MemberPhase
from fleet.state import JobStore, NodeStore

#: how often a failed member looks at its peers while it waits
POLL_S = 0.5


def member_failed(
    jobs: JobStore, nodes: NodeStore, job: Job, node: str, exit: Exit, wait_s: float, stop: threading.Event
) -> Exit:
    """The exit the attempt ends with, given that the member on ``node`` ended with ``exit``."""
    rank = job.rank_on(node) or 0
    own = exit.model_copy(update={"reason": f"member {rank} on {node}: {exit.reason}"})
    if exit.fault != Fault.JOB or job.cancel_requested:  # a cancel ends it whatever the peers say
        return own
    jobs.member(job, rank, MemberPhase.FAILED)
    peers = [n for n in job.nodes_held if n != node]
    deadline = time.monotonic() + wait_s
    while True:
        down = [n for n, up in nodes.alive(peers).items() if not up]
        if down:
            why = f"{own.reason}, after node {down[0]} of member {job.rank_on(down[0])} went down"
            return Exit(code=exit.code, oom=exit.oom, fault=Fault.INFRA, kind=ExitKind.NODE_DOWN, reason=why)
        current = jobs.get(job.id)
        if current.attempt != job.attempt or not current.state.on_node or time.monotonic() >= deadline:
            return own
        if all(phase == MemberPhase.FAILED for phase in current.member_phases):
            return own.model_copy(update={"reason": f"{own.reason} (every member failed)"})
        if stop.wait(POLL_S):
            return own
