"""Retention, carried out (the decisions are the pure ``retention.py``): jobs go
``job_retention_s`` after they ended, nodes gone for ``node_retention_s`` go with their bus queue,
the accounting rows of days that ended ``accounting_retention_s`` ago go too.
Every write is fenced by the leader token, each job and node checked again in the store's script.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fleet.bus import Bus, node_queue
from fleet.config import Settings
from fleet.controller import retention
from fleet.controller.views import ViewCache
from fleet.log import event
from fleet.state import NodeStore
from fleet.state.accounting import AccountingStore
from fleet.state.records import NodeBatch
from fleet.state.retention import RetentionStore

log = logging.getLogger("fleet.controller")
#: batches of ``retention_batch`` jobs one retention pass deletes at most (the rest: next pass)
RETENTION_BATCHES = 20


class Expiry:
    def __init__(
        self,
        store: RetentionStore,
        nodes: NodeStore,
        bus: Bus,
        views: ViewCache,
        settings: Settings,
        clock: Callable[[], float],
        token: Callable[[], str],
        accounting: AccountingStore,
    ) -> None:
        self.store, self.nodes, self.bus, self.views, self.settings = store, nodes, bus, views, settings
        self.accounting = accounting
        self.clock, self.token = clock, token
        #: jobs that ended before fleet had retention are tracked once per leadership
        self.tracked = False

    def expire(self) -> int:
        """Delete what is past its retention; the number of jobs deleted."""
        if not self.tracked:
            self._track_ended()
        deleted = self._expire_jobs()
        self._remove_gone_nodes()
        self._trim_accounting()
        return deleted

    def _track_ended(self) -> None:
        added = self.store.track_ended(self.clock(), self.token())
        if added:
            event(log, "ended_jobs_tracked", count=added, why="ended before fleet had retention")
        self.tracked = True

    def _expire_jobs(self) -> int:
        now, keep = self.clock(), self.settings.job_retention_s
        batch = self.settings.controller.retention_batch
        deleted = 0
        for _ in range(RETENTION_BATCHES):
            due = retention.due_jobs(self.store.oldest_ended(batch), now, keep)
            deleted += self.store.expire_jobs(
                due, now - keep, now, self.settings.tombstone_retention_s, self.token()
            )
            if len(due) < batch:
                break
        if deleted:
            event(log, "jobs_expired", count=deleted, retention_s=f"{keep:g}")
        return deleted

    def _trim_accounting(self) -> None:
        keep = self.settings.accounting_retention_s
        days = self.accounting.trim(self.clock(), keep, self.token())
        if days:
            event(log, "accounting_trimmed", days=days, retention_s=f"{keep:g}")

    def _remove_gone_nodes(self) -> None:
        now, keep = self.clock(), self.settings.node_retention_s
        # only nodes without a lease are read (one MGET tells which); the removal script checks
        # lease, jobs and last heartbeat again
        down = [name for name, up in self.nodes.alive(self.nodes.names()).items() if not up]
        gone = self.views.read_nodes(down, all_claims=False).nodes if down else []
        for name in retention.gone_nodes(gone, now, keep):
            if self.store.remove_node(name, now - keep, self.token()):
                self.views.install(NodeBatch(), now, {name})
                keys = self.bus.delete_queue(node_queue(name))
                event(log, "node_removed", node=name, bus_keys=keys, retention_s=f"{keep:g}")
