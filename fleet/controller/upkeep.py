"""The controller's reconcile, carried out: failure detection (the decisions are the pure
``reconcile.py``).

The periodic reconcile sorts jobs on nodes, nodes and claims into buckets executed here: requeue jobs
of lost nodes and launches past their deadline (without spending retries), stop drained jobs, mark
nodes DRAINED, free orphan claims. Every write is fenced by the leader token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fleet.bus import Bus, stop_attempt
from fleet.config_sections import ControllerSettings
from fleet.controller.elasticity import Elasticity
from fleet.controller.reconcile import Buckets, DrainStop, Requeue, reconcile
from fleet.controller.tenancy import Tenancy
from fleet.controller.views import ViewCache
from fleet.lifecycle import RetryPolicy, decide
from fleet.log import event
from fleet.models import Job, Node, NodeState
from fleet.state import JobStore, NodeStore
from fleet.state.records import NodeBatch

log = logging.getLogger("fleet.controller")


class Upkeep:
    def __init__(
        self,
        jobs: JobStore,
        nodes: NodeStore,
        bus: Bus,
        views: ViewCache,
        tenancy: Tenancy,
        elasticity: Elasticity,
        cfg: ControllerSettings,
        policy: RetryPolicy,
        stop_grace_s: float,
        clock: Callable[[], float],
        token: Callable[[], str],
    ) -> None:
        self.jobs, self.nodes, self.bus, self.views, self.cfg = jobs, nodes, bus, views, cfg
        self.tenancy, self.elasticity, self.policy = tenancy, elasticity, policy
        self.stop_grace_s = stop_grace_s
        self.clock, self.token = clock, token

    def reconcile(self) -> Buckets:
        now = self.clock()
        if self.views.full_read_due():
            nodes = self.views.read_nodes()
            jobs = self.views.readable(self.jobs.read_on_nodes(), now)
            self.views.install(nodes, now)  # the scheduler's safety net too: every view read again
            self.tenancy.resync(jobs, now)
            self.elasticity.resync(jobs, self.views.queue.jobs)
        else:
            nodes, jobs = self._watched(now)
        # a node whose record cannot be read but whose agent holds its lease keeps its jobs
        unreadable = [Node(name=n, state=NodeState.READY, alive=True) for n in nodes.corrupt_alive]
        buckets = reconcile([*nodes.nodes, *unreadable], jobs, nodes.claims, now, self.cfg)
        for requeue in (*buckets.requeue_lost, *buckets.timeouts):
            self._requeue(requeue, now)
        for stop in buckets.drain_stops:
            self._drain_stop(stop, now)
        operators = {n.name: n.changed_by for n in nodes.nodes}
        for name in buckets.drained:
            if self.nodes.set_state(
                name,
                NodeState.DRAINED,
                "drained",
                now,
                operators.get(name, ""),
                leader=self.token(),
                only_from=[NodeState.DRAINING],
            ):
                event(log, "node_drained", node=name)
        if buckets.orphan_claims and self.jobs.release_orphan_claims(buckets.orphan_claims, self.token()):
            event(
                log,
                "orphan_claims_released",
                logging.WARNING,
                claims=",".join(f"{uuid}={holder}" for uuid, holder in buckets.orphan_claims),
            )
        return buckets

    def _watched(self, now: float) -> tuple[NodeBatch, list[Job]]:
        """Between full reconciles (every ``resync_interval_s``), what can need the controller within
        seconds: nodes whose lease came or went (one MGET over every lease), nodes down or draining,
        and jobs being launched (deadlines) with their nodes. Claims are left to the full pass, so
        the batch holds only these nodes' claims and finds no orphan."""
        alive = self.nodes.alive(sorted(self.views.known))
        flipped = {name for name, up in alive.items() if up != self.views.known[name].alive}
        launching = self.views.readable(self.jobs.read_launching(), now)
        watched = flipped | {node for j in launching for node in j.nodes_held}
        known = self.views.known.values()
        watched |= {n.name for n in known if not n.alive or n.admin_state == NodeState.DRAINING}
        if not watched:
            return NodeBatch(), launching
        nodes = self.views.read_nodes(sorted(watched), all_claims=False)
        on_watched = {job_id for n in nodes.nodes for job_id in n.jobs} - {j.id for j in launching}
        jobs = [*launching, *self.views.readable(self.jobs.read_many(on_watched), now)]
        # a multi-node job on a watched node has members on other nodes: read those too, or reconcile
        # takes a node it was not given for one without a record, and requeues a running job
        peers = {node for j in jobs for node in j.nodes_held} - watched
        if peers:
            nodes = nodes.merged(self.views.read_nodes(sorted(peers), all_claims=False))
            watched |= peers
        self.views.install(nodes, now, watched)
        return nodes, jobs

    def _requeue(self, requeue: Requeue, now: float) -> None:
        """Requeue without spending retries, if the job is still where the snapshot saw it."""
        job, exit = requeue.job, requeue.exit
        decision = decide(job, exit, self.policy)
        if not self.jobs.end_attempt(job, exit, decision, now, leader=self.token(), allowed=[job.state]):
            return
        # back in the queue: the next pass reads it (no agent message will come)
        self.views.touch(jobs=[job.id], nodes=job.nodes_held)
        event(
            log,
            "job_requeued",
            job=job.id,
            attempt=job.attempt,
            node=job.node,
            kind=exit.kind,
            state=decision.state,
            reason=exit.reason,
        )
        if requeue.stop or len(job.members) > 1:  # a gang's live members too, whichever node was lost
            stop_attempt(self.bus, job.id, job.attempt, job.nodes_held, exit.reason, self.stop_grace_s)

    def _drain_stop(self, drain: DrainStop, now: float) -> None:
        """SIGTERM with a grace period to checkpoint; the agent requeues it without spending retries."""
        job = drain.job
        if self.jobs.ask_to_leave(job, drain.reason, drain.grace_s, now, self.token()):
            stop_attempt(self.bus, job.id, job.attempt, job.nodes_held, drain.reason, drain.grace_s)
