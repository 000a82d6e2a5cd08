"""The agent's reconcile as a pure function: (what the runtime holds, what Redis says) -> buckets.

Like Nomad's ``reconcile_node.go``, every attempt lands in at most one bucket and the service only
executes them, so the decisions are property-tested without processes or Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleet.agent.runtime.base import AttemptStatus
from fleet.models import Job, JobState, MemberPhase

Key = tuple[str, int]


@dataclass
class Buckets:
    #: exited attempts whose end is to be recorded (or that are stale and only to be removed)
    finish: list[AttemptStatus] = field(default_factory=list)
    #: running attempts that are not the job's current attempt on this node: kill and remove
    stale: list[AttemptStatus] = field(default_factory=list)
    #: current attempts the user cancelled or an operator drained: stop with a grace period
    stop: list[AttemptStatus] = field(default_factory=list)
    #: current running attempts nobody ships logs for (a restarted agent): follow them again
    reattach: list[AttemptStatus] = field(default_factory=list)
    #: current running attempts of elastic jobs, with the batch their record says they run at (one
    #: told another, a lost ``Rebatch``, is told again)
    rebatch: list[tuple[AttemptStatus, int]] = field(default_factory=list)
    #: jobs placed here whose launch message may have been lost
    launch: list[Job] = field(default_factory=list)
    #: jobs Redis says run here, of which the runtime holds nothing
    lost: list[Job] = field(default_factory=list)


def reconcile(
    node: str,
    held: Iterable[AttemptStatus],
    jobs: Mapping[str, Job],
    on_node: Iterable[Job],
    busy: set[Key],
    shipping: set[Key],
) -> Buckets:
    """``held``: the runtime's attempts; ``jobs``: their jobs by id (missing = no such job);
    ``on_node``: jobs Redis binds to ``node``; ``busy``: attempts being launched or finished now."""
    out = Buckets()
    held_keys = set()
    for status in held:
        key = (status.job_id, status.attempt)
        held_keys.add(key)
        if key not in busy:
            _held(node, status, jobs.get(status.job_id), key in shipping, out)
    for job in on_node:
        key = (job.id, job.attempt)
        if key in held_keys or key in busy:
            continue
        # a member of a multi-node job that ended with 0 is done while the others run; one that
        # never started is launched even when the job is STARTING (another member started it)
        phase = _phase(node, job)
        if phase == MemberPhase.DONE:
            continue
        if job.state == JobState.SCHEDULED or (job.state == JobState.STARTING and phase == MemberPhase.NONE):
            out.launch.append(job)
        elif job.state in (JobState.STARTING, JobState.RUNNING):
            out.lost.append(job)
    return out


def _phase(node: str, job: Job) -> MemberPhase | None:
    rank = job.rank_on(node)
    return job.member_phases[rank] if rank is not None and rank < len(job.member_phases) else None


def still_lost(node: str, seen: Job, now: Job) -> bool:
    """Whether the attempt ``seen`` (as a reconcile read it) is still lost by the job's record read
    ``now``, once its end is claimed: it may have ended meanwhile, by this node (a member done, its
    exit recorded and its attempt removed between the reconcile's reads) or by the controller."""
    return (
        now.attempt == seen.attempt
        and now.state in (JobState.STARTING, JobState.RUNNING)
        and node in now.nodes_held
        and _phase(node, now) != MemberPhase.DONE
    )


def _held(node: str, status: AttemptStatus, job: Job | None, shipping: bool, out: Buckets) -> None:
    current = (
        job is not None and job.attempt == status.attempt and node in job.nodes_held and job.state.on_node
    )
    if status.running and not current:
        out.stale.append(status)
    elif status.running and job is not None:
        if job.cancel_requested or job.preempt:
            out.stop.append(status)
            return
        if not shipping:
            out.reattach.append(status)
        if job.spec.elastic and job.state == JobState.RUNNING and job.batch_size:
            out.rebatch.append((status, job.batch_size))
    elif status.exit is not None:
        out.finish.append(status)
