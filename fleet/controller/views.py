"""What the leader keeps in memory between passes: the pending queue and the nodes' views.

Cost follows what changed: messages name jobs and nodes (``touch``), and a refresh reads only
those, the jobs the changed-jobs feed names (a user's hold, release, update, requeue: they take
effect at the next pass even when their message is lost), the nodes the nodes-changed feed names,
and the queue fully again from Redis every
``resync_interval_s`` (or when a cheap count says it drifted). The full reconcile reads every node
each ``resync_interval_s`` too and installs it here, the scheduler's safety net. Records that do
not parse are left out and quarantined (fenced by the leader token like every controller write).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from fleet.config_sections import ControllerSettings
from fleet.controller import snapshot
from fleet.log import event
from fleet.models import Job, JobState, Node
from fleet.scheduler import NodeView, PendingQueue, Placement, dependencies
from fleet.state import JobStore, NodeStore
from fleet.state.ranked import RankIndex
from fleet.state.records import JobBatch, NodeBatch

log = logging.getLogger("fleet.controller")


class ViewCache:
    def __init__(
        self,
        jobs: JobStore,
        nodes: NodeStore,
        ranked: RankIndex,
        cfg: ControllerSettings,
        token: Callable[[], str],
        observe: Callable[[list[Job]], None],
    ) -> None:
        self.jobs, self.nodes, self.ranked, self.cfg, self.token = jobs, nodes, ranked, cfg, token
        #: told of every job read (the pass's other inputs follow them too)
        self.observe = observe
        self.queue = PendingQueue()
        self.views: dict[str, NodeView] = {}
        #: each node as last read, and the nodes-changed version that read saw (see fleet.keys)
        self.known: dict[str, Node] = {}
        self._node_version = 0
        #: the changed-jobs feed's version at the last look; -1: none yet (see fleet.keys)
        self._job_version = -1
        self._views_changed = False
        #: max_running of the arrays whose tasks are queued (read with the tasks)
        self._array_limits: dict[str, int] = {}
        #: queued jobs that wait for dependencies, and the dependencies still open at the last look
        self._after: dict[str, set[str]] = {}
        #: messages arrive on the bus's threads, the refresh runs on the controller's
        self._lock = threading.Lock()
        self._touched_jobs: set[str] = set()
        self._touched_nodes: set[str] = set()
        self._reload = False
        self._next_resync = 0.0
        self._next_count = 0.0
        self._next_full_read = 0.0

    def touch(self, jobs: Iterable[str] = (), nodes: Iterable[str] = (), resync: bool = False) -> None:
        """Read these jobs and nodes again at the next refresh (what was written may have moved on);
        ``resync``: the whole queue too."""
        with self._lock:
            self._touched_jobs.update(jobs)
            self._touched_nodes.update(nodes)
            self._next_resync = 0.0 if resync else self._next_resync

    def reload(self) -> None:
        """Drop everything at the next refresh (what a follower kept in memory may be stale)."""
        self._reload = True

    def full_read_due(self) -> bool:
        """True once each ``resync_interval_s`` (and first after a reload): time for the reconcile to
        read every node and every job on nodes."""
        if time.monotonic() < self._next_full_read:
            return False
        self._next_full_read = time.monotonic() + self.cfg.resync_interval_s
        return True

    def refresh(self, now: float) -> bool:
        """Bring the queue and the node views up to date; True when anything changed."""
        with self._lock:
            jobs, nodes = self._touched_jobs, self._touched_nodes
            self._touched_jobs, self._touched_nodes = set(), set()
        if self._reload:
            self._reload, self.queue, self.views, self._next_resync = False, PendingQueue(), {}, 0.0
            self.known, self._next_full_read, self._job_version, self._after = {}, 0.0, -1, {}
        jobs |= self._changed_jobs() | self._dependencies_ended()
        if time.monotonic() >= self._next_resync or self._queue_drifted():
            self._next_resync = time.monotonic() + self.cfg.resync_interval_s
            jobs |= self._resync_queue()
        queue_changed = self._load_jobs(jobs, now) if jobs else False
        return self._refresh_nodes(nodes, now) | queue_changed

    def array_room(self) -> dict[str, int]:
        """How many more tasks each limited array waiting here may start (max_running - on nodes)."""
        arrays = self.queue.arrays() & self._array_limits.keys()
        if not arrays:
            return {}
        active = self.jobs.array_active_counts(arrays)
        return {a: self._array_limits[a] - active.get(a, 0) for a in arrays}

    def _changed_jobs(self) -> set[str]:
        """The jobs users changed in the queue since the last look, from state, not messages: one
        cheap read when none did. Every queued job when some changes are no longer listed; none at
        the first look (the resync that follows reads the whole queue)."""
        ids, version, missed = self.jobs.changed_since(self._job_version)
        first, self._job_version = self._job_version < 0, version
        if first:
            return set()
        return set(self.queue.jobs) if missed else set(ids)

    def _queue_drifted(self) -> bool:
        """Each ``schedule_interval_s``, one cheap count: a submit whose message was lost shows up
        here within seconds, not at the next full resync."""
        if time.monotonic() < self._next_count:
            return False
        self._next_count = time.monotonic() + self.cfg.schedule_interval_s
        return self.jobs.count_queued() != len(self.queue)

    def _resync_queue(self) -> set[str]:
        """State is the truth: the ids to (re)load so the queue in memory matches Redis (and the
        rank index that positions are read from matches the queue)."""
        self.ranked.backfill()
        self.ranked.repair()
        stored = set(self.jobs.queued_ids())
        for gone in set(self.queue.jobs) - stored:
            self.queue.discard(gone)
        return stored - set(self.queue.jobs)

    def _load_jobs(self, ids: set[str], now: float) -> bool:
        """Read these jobs into the queue or out of it. True when a pass may now place something
        it could not before: the queue gained or lost a job, or a task of an array with a
        ``max_running`` left the nodes (its room grew). Jobs that only moved along on their nodes
        (STARTING, RUNNING) change nothing: freed GPUs come through the nodes' feed."""
        readable = self.readable(self.jobs.read_many(ids), now)
        self.observe(readable)
        waits, cancelled = self._judge([j for j in readable if j.state == JobState.QUEUED], now)
        queued = [j for j in readable if j.state == JobState.QUEUED and j.id not in cancelled]
        for job_id in ids - {j.id for j in queued}:
            self._after.pop(job_id, None)
        gone = [job_id for job_id in ids - {j.id for j in queued} if self.queue.discard(job_id) is not None]
        pending = [snapshot.pending(j, waits.get(j.id, "")) for j in queued]
        added = self.queue.add_many(pending, {j.id: j.reason for j in queued})
        self._array_limits.update(
            {j.array_id: j.array_max_running for j in queued if j.array_id and j.array_max_running}
        )
        room = any(j.array_id in self._array_limits and not j.state.on_node for j in readable)
        return bool(gone or added or room)

    def _dependencies_ended(self) -> set[str]:
        """The waiting jobs one of whose open dependencies ended (or went) since the last look: one
        pipelined read of those dependencies' states per pass, none while no job waits."""
        if not self._after:
            return set()
        states = self.jobs.states(set().union(*self._after.values()))
        ended = {d for d, s in states.items() if s is None or s.final}
        return {job_id for job_id, deps in self._after.items() if deps & ended}

    def _judge(self, queued: list[Job], now: float) -> tuple[dict[str, str], set[str]]:
        """Why each queued job waits for its dependencies, and the jobs cancelled because one can
        never be satisfied (their own dependents follow at the next pass: they see them ended)."""
        waiting = [j for j in queued if j.spec.after]
        if not waiting:
            return {}, set()
        states = self.jobs.states(d.job for j in waiting for d in j.spec.after)
        waits, cancelled = {}, set()
        for job in waiting:
            found = dependencies.verdict(job.spec.after, states)
            self._after.pop(job.id, None)
            if found.never:
                cancelled.add(job.id)  # or changed since it was read: the changed-jobs feed names it
                if self.jobs.transition(
                    job.id,
                    to=JobState.CANCELLED,
                    allowed=[JobState.QUEUED],
                    reason=found.never,
                    now=now,
                    fields={"finished_at": now},
                    leader=self.token(),
                ):
                    event(log, "dependency_never_satisfied", job=job.id, reason=found.never)
            elif found.waiting:
                waits[job.id] = found.waiting
                self._after[job.id] = {
                    d.job for d in job.spec.after if dependencies.satisfied(d.when, states.get(d.job)) is None
                }
        return waits, cancelled

    def _refresh_nodes(self, names: set[str], now: float) -> bool:
        """Read the nodes whose view changed: those the nodes-changed feed names since the last look
        (heartbeats whose placement digest changed, admin states, jobs placed or released), and those
        messages and lease checks named; every node when none is known yet or the feed's counter
        went back. True when a view changed (here or by an ``install`` since the last refresh)."""
        changed, version = self.nodes.changed_since(self._node_version)
        if not self.known or version < self._node_version:
            self.install(self.read_nodes(), now)
        elif names := names | set(changed):
            self.install(self.read_nodes(sorted(names), all_claims=False), now, names)
        self._node_version = version
        dirty, self._views_changed = self._views_changed, False
        return dirty

    def install(self, batch: NodeBatch, now: float, names: set[str] | None = None) -> None:
        """Take the nodes just read as the scheduler's views: all of them (``names`` None), or those
        named (a name not in the batch is gone or unreadable: its view goes)."""
        if names is None:
            views, nodes = {}, {}
        else:
            views = {n: v for n, v in self.views.items() if n not in names}
            nodes = {n: v for n, v in self.known.items() if n not in names}
        views.update({n.name: snapshot.node_view(n, now, self.cfg.topology_label) for n in batch.nodes})
        nodes.update({n.name: n for n in batch.nodes})
        self._views_changed |= views != self.views
        self.views, self.known = views, nodes

    def placed(self, members: list[Placement], attempt: int) -> None:
        """A placement was written: its nodes' views hold its claims from now on. The nodes are read
        again at the next refresh, and a read that differs from this counts as a change, so GPUs the
        job gave back before that read (it ended at once) are seen free, not as they were."""
        job = members[0].job_id
        for name in {p.node for p in members} & self.views.keys():
            self.views[name] = snapshot.claimed(self.views[name], members, f"{job}:{attempt}")

    # -- unreadable records ------------------------------------------------------------

    def readable(self, batch: JobBatch, now: float) -> list[Job]:
        """The jobs that parsed; the others are quarantined (each logged once, by whoever leads)."""
        for job_id, reason in batch.corrupt.items():
            if self.jobs.quarantine(job_id, reason, now, self.token()):
                event(log, "record_quarantined", logging.WARNING, kind="job", id=job_id, reason=reason)
        return batch.jobs

    def read_nodes(self, names: list[str] | None = None, all_claims: bool = True) -> NodeBatch:
        """Nodes as stored; an unreadable record is left out of scheduling and quarantined (logged
        once), and forgotten from quarantine once it reads again (an agent rewrote it)."""
        names = self.nodes.names() if names is None else names
        batch = self.nodes.read(names, all_claims)
        for name, reason in batch.corrupt.items():
            if self.nodes.quarantine(name, reason, self.token()):
                event(log, "record_quarantined", logging.WARNING, kind="node", id=name, reason=reason)
        for name in (batch.quarantined.keys() & set(names)) - batch.corrupt.keys():
            if self.nodes.quarantine(name, "", self.token()):
                event(log, "record_recovered", kind="node", id=name)
        return batch
