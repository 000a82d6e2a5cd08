"""What happens to a job when an attempt ends: pure policy, no I/O.

``decide`` returns a :class:`~fleet.models.Decision`, ``(state, delay, reason)`` plus the
counters to bump, which its caller (the agent, or the controller for a lost node) hands to
``JobStore.end_attempt`` to apply: the store applies decisions, it never makes them.

Job faults (non-zero exit, OOM) spend the job's ``max_attempts`` budget with exponential backoff;
infrastructure faults (node lost, GPU busy at launch, a node that cannot prepare the attempt,
fencing) do not spend it, bounded by a separate cap so a job that keeps losing its node cannot loop
forever. The first infrastructure requeue is at once; later ones back off like retries, so a fault
that repeats within milliseconds (a node that fails every launch alike) cannot spend the cap in one
burst. A drain, a preemption or a time limit with ``requeue_on_timeout`` (chosen, not suffered)
requeues at once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.models import Decision, Exit, ExitKind, Fault, Job, JobState

#: kinds of infrastructure exit that were chosen, not suffered (a resize, an operator's drain, a
#: preemption, a time limit the job asked to be requeued at): requeued at once, never backed off
CHOSEN = frozenset({ExitKind.RESIZE, ExitKind.DRAIN, ExitKind.PREEMPTED, ExitKind.TIMEOUT})
#: exit codes shells and init (tini, the process runtime's shim) give a program that never ran
CANNOT_RUN = {
    127: "the program was not found (a typo, or not in the image's PATH or the shipped directory)",
    126: "the program is not executable",
}


#: what CPython prints (on stderr, then exit 2) when the script it was given does not exist: a path
#: wrong in every attempt alike. Recognised only together with exit code 2, in the attempt's last lines
_NO_SCRIPT = re.compile(r"python[\d.]*: can't open file .*: \[Errno 2\] No such file or directory")
#: how many of an attempt's last output lines ``explain`` looks at
TAIL_LINES = 5


def explain(exit: Exit, tail: Sequence[str]) -> Exit:
    """``exit`` as not retryable (fault ``fatal``) when the attempt's last output lines (``tail``)
    say its program never ran: ``python X.py`` exiting 2 with "can't open file 'X.py': [Errno 2]".
    Exit 126 and 127 (shells and init) need no output: :func:`decide` knows them by code."""
    if exit.fault != Fault.JOB or exit.code != 2 or exit.oom:
        return exit
    said = next((line.strip() for line in reversed(tail) if _NO_SCRIPT.search(line)), None)
    if said is None:
        return exit
    why = (
        f"{exit.reason}: {said[-300:]}: the script is not in the job's working directory (ship it "
        "with --workdir, or give its path inside the image)"
    )
    return Exit(code=exit.code, fault=Fault.FATAL, reason=why)


@dataclass(frozen=True)
class RetryPolicy:
    backoff_s: float = 5.0
    backoff_max_s: float = 300.0
    max_infra_requeues: int = 10

    def backoff(self, failures: int) -> float:
        """Delay before the attempt after ``failures`` job faults: base * 2^(failures-1), capped."""
        return float(min(self.backoff_s * 2.0 ** max(failures - 1, 0), self.backoff_max_s))


def decide(job: Job, exit: Exit, policy: RetryPolicy) -> Decision:
    """What becomes of ``job`` now that its current attempt ended with ``exit``; the caller
    applies it (``JobStore.end_attempt``)."""
    if job.cancel_requested or exit.fault == Fault.CANCEL:
        return Decision(JobState.CANCELLED, 0.0, "cancelled by user")
    if exit.fault == Fault.INFRA:
        return _infra(job, exit, policy)
    if exit.succeeded:
        return Decision(JobState.SUCCEEDED, 0.0, exit.reason or "exited 0")
    if exit.fault == Fault.FATAL:
        return Decision(JobState.FAILED, 0.0, f"{exit.reason}; not retryable", {"failures": 1})
    if exit.code in CANNOT_RUN and not exit.oom:
        why = f"{exit.reason}: {CANNOT_RUN[exit.code]}; not retryable (another attempt would fail alike)"
        return Decision(JobState.FAILED, 0.0, why, {"failures": 1})
    return _job_fault(job, exit, policy)


def _job_fault(job: Job, exit: Exit, policy: RetryPolicy) -> Decision:
    failures = job.failures + 1
    budget = job.spec.max_attempts
    if failures >= budget:
        return Decision(
            JobState.FAILED, 0.0, f"{exit.reason}; {failures} of {budget} attempts used", {"failures": 1}
        )
    delay = policy.backoff(failures)
    reason = f"{exit.reason}; retry {failures + 1} of {budget} in {delay:g}s"
    return Decision(JobState.QUEUED, delay, reason, {"failures": 1})


def _infra(job: Job, exit: Exit, policy: RetryPolicy) -> Decision:
    if exit.kind == ExitKind.RESIZE:
        return Decision(
            JobState.QUEUED,
            0.0,
            f"{exit.reason}; requeued at its new size (retry budget not spent)",
            {"resizes": 1},
        )
    requeues = job.infra_requeues + 1
    if requeues > policy.max_infra_requeues:
        cap = policy.max_infra_requeues
        return Decision(JobState.FAILED, 0.0, f"{exit.reason}; infrastructure requeue cap ({cap}) reached")
    # the first at once (a lost node: run elsewhere now); after that, backoff as for job faults
    delay = 0.0 if exit.kind in CHOSEN or requeues == 1 else policy.backoff(requeues - 1)
    when = f" in {delay:g}s" if delay else ""
    return Decision(
        JobState.QUEUED,
        delay,
        f"{exit.reason}; requeued{when} (retry budget not spent)",
        {"infra_requeues": 1},
    )
