"""``schedule(snapshot, now) -> Plan``: tenants in fair-share order (``fairshare.py``), within a
tenant priority first, then submission order; best-fit packing.

A GPU job that fits some node when empty but not now *reserves* the node closest to fitting it:
lower-ranked GPU jobs are not placed there, so a large job is not starved by a stream of small
ones (they still use every other node). A job no node could ever fit stays QUEUED with the
reason, because a node that fits may join later. GPUs, CPUs and memory are all scheduled.

This is the from-scratch pass over a snapshot; the controller keeps a :class:`PendingQueue` across
passes instead (same code), and the property tests check that both place the same jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet.scheduler.capacity import Capacity
from fleet.scheduler.fairshare import FairShare
from fleet.scheduler.queue import PendingQueue
from fleet.scheduler.snapshot import Plan, Snapshot


def schedule(
    snapshot: Snapshot, now: float, room: Mapping[str, int] | None = None, fair: FairShare | None = None
) -> Plan:
    return PendingQueue(snapshot.jobs).schedule(Capacity(snapshot.nodes), now, room, fair)
