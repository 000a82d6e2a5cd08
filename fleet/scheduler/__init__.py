"""Placement policy: a pure function from a snapshot to a plan. Imports no I/O module."""

from fleet.scheduler.schedule import schedule
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob, Placement, Plan, Snapshot

__all__ = ["GpuSlot", "NodeView", "PendingJob", "Placement", "Plan", "Snapshot", "schedule"]
