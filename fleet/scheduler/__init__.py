"""Placement policy: a pure function from a snapshot to a plan. Imports no I/O module."""

from fleet.scheduler.capacity import Capacity
from fleet.scheduler.queue import BACKOFF, PendingQueue
from fleet.scheduler.schedule import schedule
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob, Placement, Plan, Snapshot

__all__ = [
    "BACKOFF", "Capacity", "GpuSlot", "NodeView", "PendingJob", "PendingQueue", "Placement", "Plan",
    "Snapshot", "schedule",
]  # fmt: skip
