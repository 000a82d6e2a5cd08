"""Placement policy: a pure function from a snapshot to a plan. Imports no I/O module."""

from fleet.scheduler.capacity import Capacity
from fleet.scheduler.fairshare import FairShare, Use, fair_gpus, fleet_size
from fleet.scheduler.preempt import Preemption, RunningJob, preemptions
from fleet.scheduler.queue import BACKOFF, PendingQueue
from fleet.scheduler.schedule import schedule
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob, Placement, Plan, Snapshot

__all__ = [
    "BACKOFF",
    "Capacity",
    "FairShare",
    "GpuSlot",
    "NodeView",
    "PendingJob",
    "PendingQueue",
    "Placement",
    "Plan",
    "Preemption",
    "RunningJob",
    "Snapshot",
    "Use",
    "fair_gpus",
    "fleet_size",
    "preemptions",
    "schedule",
]
