"""Retention in Redis: ended jobs and gone nodes are deleted, each job leaving a tombstone that expires.

The controller (leader only, every write fenced by its token) reads the oldest ended jobs and the
nodes, decides what is due with the pure ``fleet.controller.retention``, and deletes it here; the
scripts check each job and node again, so a decision from a slightly old read deletes nothing that
moved on. Agents ask :meth:`RetentionStore.expired` which checkpoint directories may go.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

import redis

from fleet.errors import NotLeader
from fleet.keys import Keys
from fleet.models import FINAL_STATES
from fleet.state.connection import load_scripts, translated

_FINAL = ",".join(sorted(s.value for s in FINAL_STATES))


class RetentionStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)

    @translated
    def oldest_ended(self, limit: int) -> list[tuple[str, float]]:
        """Up to ``limit`` ``(job id, end time)`` of ended jobs, longest ended first."""
        return [(i, float(at)) for i, at in self.redis.zrange(self.keys.ended, 0, limit - 1, withscores=True)]

    @translated
    def expire_jobs(
        self, job_ids: Sequence[str], cutoff: float, now: float, tombstone_s: float, leader: str
    ) -> int:
        """Delete each job still ended at or before ``cutoff``, with its events and logs, leaving a
        tombstone for ``tombstone_s``; the number deleted (leader only)."""
        if not job_ids:
            return 0
        k = self.keys
        keys = [k.ended, k.jobs, k.quarantined_jobs, k.queued, k.leader]
        args = [leader, k.prefix, cutoff, now, max(int(tombstone_s * 1000), 1), _FINAL, *job_ids]
        deleted = int(self._scripts["expire_jobs"](keys=keys, args=args))
        if deleted == -2:
            raise NotLeader("expiry of jobs refused: another controller holds the leader lease")
        return deleted

    @translated
    def remove_node(self, name: str, cutoff: float, leader: str) -> bool:
        """Remove a node record if it is still gone since ``cutoff`` and holds no job (leader only)."""
        k = self.keys
        keys = [k.node(name), k.node_lease(name), k.node_jobs(name), k.nodes, k.quarantined_nodes, k.leader]
        code = int(self._scripts["expire_node"](keys=keys, args=[leader, name, cutoff]))
        if code == -2:
            raise NotLeader(f"removal of node {name} refused: another controller holds the leader lease")
        return code == 1

    @translated
    def track_ended(self, now: float, leader: str, batch: int = 1000) -> int:
        """Add final jobs that ended before fleet had retention to the ended zset (leader only);
        the number added. Reads every final job's id once: run it when leadership begins."""
        added = 0
        for state in sorted(FINAL_STATES):
            for ids in _chunks(self.redis.sscan_iter(self.keys.jobs_in(state), count=batch), batch):
                added += self._track(ids, now, leader)
        return added

    def _track(self, job_ids: list[str], now: float, leader: str) -> int:
        k = self.keys
        args = [leader, k.prefix, now, _FINAL, *job_ids]
        code = int(self._scripts["track_ended"](keys=[k.ended, k.leader], args=args))
        if code == -2:
            raise NotLeader("tracking of ended jobs refused: another controller holds the leader lease")
        return code

    @translated
    def expired(self, job_ids: Iterable[str]) -> set[str]:
        """Those of ``job_ids`` that retention deleted: no record, and a tombstone that says so.
        (A name with neither is unknown here: another fleet's, or forgotten; never reported.)"""
        found: set[str] = set()
        for ids in _chunks(iter(job_ids), 500):
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.exists(self.keys.job(job_id))
                pipe.exists(self.keys.tombstone(job_id))
            answers = pipe.execute()
            found.update(
                i for i, job, gone in zip(ids, answers[0::2], answers[1::2], strict=True) if gone and not job
            )
        return found


def _chunks(items: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(items, size)):
        yield chunk
