"""What retention deletes now: a pure function of the oldest ended jobs and of the nodes.

- a job goes once it ended at least ``job_retention_s`` ago (SUCCEEDED, FAILED or CANCELLED; a
  quarantined record counts from when it was set aside), with its events and logs;
- a node goes once nothing heartbeat it for at least ``node_retention_s`` (its lease expired long
  ago) and it holds no job and no GPU claim, with its bus queue.

The controller reads, calls these, and deletes through ``fleet.state.retention`` (fenced by its
leader token, each job and node checked again in the script).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.models import Node


def due_jobs(ended: Sequence[tuple[str, float]], now: float, retention_s: float) -> tuple[str, ...]:
    """Ids of the ``(job id, end time)`` pairs that ended at least ``retention_s`` before ``now``."""
    cutoff = now - retention_s
    return tuple(job_id for job_id, ended_at in ended if ended_at <= cutoff)


def gone_nodes(nodes: Sequence[Node], now: float, retention_s: float) -> tuple[str, ...]:
    """Names of nodes without a lease whose last heartbeat is at least ``retention_s`` old and that
    hold no job and no GPU claim (those wait for the reconcile to requeue or release them)."""
    cutoff = now - retention_s
    return tuple(
        n.name for n in nodes if not n.alive and n.heartbeat_at <= cutoff and not n.jobs and not n.claims
    )
