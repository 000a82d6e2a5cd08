"""The controller's upkeep, carried out: failure detection and retention (the decisions are the pure
``reconcile.py`` and ``retention.py``).

The periodic reconcile sorts jobs on nodes, nodes and claims into buckets executed here: requeue jobs
of lost nodes and launches past their deadline (without spending retries), stop drained jobs, mark
nodes DRAINED, free orphan claims. Retention deletes jobs ``job_retention_s`` after they ended and
nodes gone for ``node_retention_s``. Every write is fenced by the leader token.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from fleet.bus import node_queue, stop_attempt
from fleet.controller import retention
from fleet.controller.reconcile import Buckets, DrainStop, Requeue, reconcile
from fleet.lifecycle import decide
from fleet.log import event
from fleet.models import Job, Node, NodeState
from fleet.state.records import NodeBatch

if TYPE_CHECKING:
    from fleet.controller.service import Controller

log = logging.getLogger("fleet.controller")
#: batches of ``retention_batch`` jobs one retention pass deletes at most (the rest: next pass)
RETENTION_BATCHES = 20


class Upkeep:
    def __init__(self, controller: Controller) -> None:
        self.c = controller

    def reconcile(self) -> Buckets:
        c = self.c
        now = c.clock()
        if time.monotonic() >= c._next_full_reconcile:
            c._next_full_reconcile = time.monotonic() + c.cfg.resync_interval_s
            nodes = c._read_nodes()
            jobs = c.readable(c.jobs.read_on_nodes(), now)
            c._install(nodes, now)  # the scheduler's safety net too: every view read again
            c.tenancy.resync(jobs, now)
            c.elasticity.resync(jobs, c.queue.jobs)
        else:
            nodes, jobs = self._watched(now)
        # a node whose record cannot be read but whose agent holds its lease keeps its jobs
        unreadable = [Node(name=n, state=NodeState.READY, alive=True) for n in nodes.corrupt_alive]
        buckets = reconcile([*nodes.nodes, *unreadable], jobs, nodes.claims, now, c.cfg)
        for requeue in (*buckets.requeue_lost, *buckets.timeouts):
            self._requeue(requeue, now)
        for stop in buckets.drain_stops:
            self._drain_stop(stop, now)
        operators = {n.name: n.changed_by for n in nodes.nodes}
        for name in buckets.drained:
            if c.nodes.set_state(name, NodeState.DRAINED, "drained", now, operators.get(name, ""),
                                    leader=c.token(), only_from=[NodeState.DRAINING]):  # fmt: skip
                event(log, "node_drained", node=name)
        if buckets.orphan_claims and c.jobs.release_orphan_claims(buckets.orphan_claims, c.token()):
            event(log, "orphan_claims_released", logging.WARNING,
                  claims=",".join(f"{uuid}={holder}" for uuid, holder in buckets.orphan_claims))  # fmt: skip
        return buckets

    def _watched(self, now: float) -> tuple[NodeBatch, list[Job]]:
        """Between full reconciles (every ``resync_interval_s``), what can need the controller within
        seconds: nodes whose lease came or went (one MGET over every lease), nodes down or draining,
        and jobs being launched (deadlines) with their nodes. Claims are left to the full pass, so
        the batch holds only these nodes' claims and finds no orphan."""
        c = self.c
        alive = c.nodes.alive(sorted(c._nodes))
        flipped = {name for name, up in alive.items() if up != c._nodes[name].alive}
        launching = c.readable(c.jobs.read_launching(), now)
        watched = flipped | {node for j in launching for node in j.nodes_held}
        watched |= {n.name for n in c._nodes.values() if not n.alive or n.admin_state == NodeState.DRAINING}
        if not watched:
            return NodeBatch(), launching
        nodes = c._read_nodes(sorted(watched), all_claims=False)
        on_watched = {job_id for n in nodes.nodes for job_id in n.jobs} - {j.id for j in launching}
        jobs = [*launching, *c.readable(c.jobs.read_many(on_watched), now)]
        # a multi-node job on a watched node has members on other nodes: read those too, or reconcile
        # takes a node it was not given for one without a record, and requeues a running job
        peers = {node for j in jobs for node in j.nodes_held} - watched
        if peers:
            nodes = nodes.merged(c._read_nodes(sorted(peers), all_claims=False))
            watched |= peers
        c._install(nodes, now, watched)
        return nodes, jobs

    def _requeue(self, requeue: Requeue, now: float) -> None:
        """Requeue without spending retries, if the job is still where the snapshot saw it."""
        c = self.c
        job, exit = requeue.job, requeue.exit
        decision = decide(job, exit, c.policy)
        if not c.jobs.end_attempt(job, exit, decision, now, leader=c.token(), allowed=[job.state]):
            return
        with c._lock:  # back in the queue: the next pass reads it (no agent message will come)
            c._touched_jobs.add(job.id)
            c._touched_nodes.update(job.nodes_held)
        event(log, "job_requeued", job=job.id, attempt=job.attempt, node=job.node, kind=exit.kind,
              state=decision.state, reason=exit.reason)  # fmt: skip
        if requeue.stop or len(job.members) > 1:  # a gang's live members too, whichever node was lost
            stop_attempt(
                c.bus, job.id, job.attempt, job.nodes_held, exit.reason, c.settings.agent.stop_grace_s
            )

    def _drain_stop(self, drain: DrainStop, now: float) -> None:
        """SIGTERM with a grace period to checkpoint; the agent requeues it without spending retries."""
        c = self.c
        job = drain.job
        if c.jobs.ask_to_leave(job, drain.reason, drain.grace_s, now, c.token()):
            stop_attempt(c.bus, job.id, job.attempt, job.nodes_held, drain.reason, drain.grace_s)

    def track_ended(self) -> None:
        c = self.c
        added = c.retention.track_ended(c.clock(), c.token())
        if added:
            event(log, "ended_jobs_tracked", count=added, why="ended before fleet had retention")
        c._tracked = True

    def expire_jobs(self) -> int:
        c = self.c
        now, batch, keep = c.clock(), c.cfg.retention_batch, c.settings.job_retention_s
        deleted = 0
        for _ in range(RETENTION_BATCHES):
            due = retention.due_jobs(c.retention.oldest_ended(batch), now, keep)
            deleted += c.retention.expire_jobs(
                due, now - keep, now, c.settings.tombstone_retention_s, c.token()
            )
            if len(due) < batch:
                break
        if deleted:
            event(log, "jobs_expired", count=deleted, retention_s=f"{keep:g}")
        return deleted

    def remove_gone_nodes(self) -> None:
        c = self.c
        now, keep = c.clock(), c.settings.node_retention_s
        # only nodes without a lease are read (one MGET tells which); the removal script checks
        # lease, jobs and last heartbeat again
        down = [name for name, up in c.nodes.alive(c.nodes.names()).items() if not up]
        for name in retention.gone_nodes(
            c._read_nodes(down, all_claims=False).nodes if down else [], now, keep
        ):
            if c.retention.remove_node(name, now - keep, c.token()):
                c._install(NodeBatch(), now, {name})
                keys = c.bus.delete_queue(node_queue(name))
                event(log, "node_removed", node=name, bus_keys=keys, retention_s=f"{keep:g}")
