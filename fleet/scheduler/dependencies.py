"""Whether a job's dependencies (``JobSpec.after``) let it run: Slurm's afterok, afterany and
afternotok over the states its dependencies are in now.

A dependency is satisfied, still open, or can never be satisfied (it ended the wrong way, or is
gone). Cycles cannot form: a job may only wait for jobs that exist when it is submitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet.models import Dependency, JobState

_WORDS = {"ok": "succeed", "any": "end", "notok": "fail"}


def satisfied(when: str, state: JobState | None) -> bool | None:
    """True: ``state`` satisfies a dependency of kind ``when``; False: it never will; None: not yet.
    A dependency that is gone (None) ended long ago: retention removes only final jobs."""
    if state is None:
        return when == "any"
    if not state.final:
        return None
    if when == "any":
        return True
    return (state == JobState.SUCCEEDED) == (when == "ok")


@dataclass(frozen=True)
class Verdict:
    #: why the job waits ('' when every dependency is satisfied)
    waiting: str = ""
    #: why it can never run ('' while it can): the job is cancelled with this reason
    never: str = ""


def verdict(after: Sequence[Dependency], states: Mapping[str, JobState | None]) -> Verdict:
    """The job's verdict from its dependencies' states (None: the dependency is gone). The first
    dependency that can never be satisfied decides; else the first still open is named."""
    waiting = ""
    for dep in after:
        state = states.get(dep.job)
        ok = satisfied(dep.when, state)
        if ok is False:
            ended = "is gone" if state is None else f"ended {state.value}"
            return Verdict(never=f"dependency {dep.job} {ended} (after {dep.when})")
        if ok is None and not waiting:
            waiting = f"waiting for job {dep.job} to {_WORDS[dep.when]}"
    return Verdict(waiting=waiting)
