"""The checker of the failover test (issue 23), in the style of Jepsen: what the clients were told,
what the jobs themselves recorded, and the fleet's final state, checked against each other.

Pure: it reads records, not Redis, so it is tested on hand-made histories (tests/unit) and the
chaos run only has to collect them. Each rule returns what broke it, in words a person can act on.

- every acknowledged submit exists at the end and ended (SUCCEEDED, or FAILED/CANCELLED as asked);
- every acknowledged cancel that said it cancelled or flagged the job left it CANCELLED;
- a job ended once: at most one of its runs finished its work, and a SUCCEEDED job has one;
- no two runs of a job overlapped in time, and no GPU was held by two runs at once;
- no GPU claim is left once every job ended.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

#: final states a job may end in
FINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class Run:
    """One run of a job, as the job recorded it: its attempt, node, GPUs, first and last tick, and
    whether it finished its work (a run killed before its end did not)."""

    job_id: str
    attempt: int
    node: str
    gpus: tuple[str, ...]
    started: float
    ended: float
    finished: bool


@dataclass
class History:
    """What the clients were told, what the jobs recorded, and what the fleet holds at the end."""

    submitted: set[str] = field(default_factory=set)  # acknowledged submits
    cancelled: set[str] = field(default_factory=set)  # acknowledged cancels that cancelled or flagged
    #: job id -> its final state; a job missing here does not exist at the end
    final: dict[str, str] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    claims: dict[str, str] = field(default_factory=dict)  # GPU -> holder, at the end


def check(history: History) -> list[str]:
    """Every violation of the rules above; empty when the history holds."""
    return [
        *_acknowledged(history.submitted, history.final),
        *_cancelled(history.cancelled, history.final),
        *_ended_once(history.final, history.runs),
        *_overlaps(_by(history.runs, lambda run: [run.job_id]), "job"),
        *_overlaps(_by(history.runs, lambda run: list(run.gpus)), "GPU"),
        *(f"GPU {gpu} still claimed by {holder}" for gpu, holder in sorted(history.claims.items())),
    ]


def _acknowledged(submitted: Iterable[str], final: Mapping[str, str]) -> list[str]:
    out = []
    for job_id in sorted(submitted):
        state = final.get(job_id)
        if state is None:
            out.append(f"job {job_id}: submit acknowledged, job lost")
        elif state not in FINAL:
            out.append(f"job {job_id}: submit acknowledged, still {state} at the end")
    return out


def _cancelled(cancelled: Iterable[str], final: Mapping[str, str]) -> list[str]:
    return [
        f"job {job_id}: cancel acknowledged, ended {final.get(job_id, 'lost')}"
        for job_id in sorted(cancelled)
        if final.get(job_id) != "CANCELLED"
    ]


def _ended_once(final: Mapping[str, str], runs: Iterable[Run]) -> list[str]:
    done: dict[str, int] = defaultdict(int)
    for run in runs:
        done[run.job_id] += run.finished
    out = [f"job {job_id}: finished its work {n} times" for job_id, n in sorted(done.items()) if n > 1]
    out += [
        f"job {job_id}: SUCCEEDED without a run that finished"
        for job_id, state in sorted(final.items())
        if state == "SUCCEEDED" and not done.get(job_id)
    ]
    return out


def _by(runs: Iterable[Run], names: Callable[[Run], list[str]]) -> dict[str, list[Run]]:
    grouped: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        for name in names(run):
            grouped[name].append(run)
    return grouped


def _overlaps(grouped: Mapping[str, list[Run]], what: str) -> list[str]:
    """Each run that started before an earlier-started one ended (the one that ends last so far)."""
    out = []
    for name, runs in sorted(grouped.items()):
        ordered = sorted(runs, key=lambda run: run.started)
        latest = ordered[0]
        for run in ordered[1:]:
            if run.started <= latest.ended:
                out.append(
                    f"{what} {name}: {_named(latest)} and {_named(run)} overlapped "
                    f"({run.started:.3f} <= {latest.ended:.3f})"
                )
            latest = max(latest, run, key=lambda r: r.ended)
    return out


def _named(run: Run) -> str:
    return f"{run.job_id} attempt {run.attempt} on {run.node}"
