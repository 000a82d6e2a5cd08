"""What a resize costs live: SIGTERM -> checkpoint -> requeue -> relaunch -> training again.

One agent with 4 simulated GPUs, the process runtime, the controller's elastic step off (so the
resizes happen when the benchmark asks, through ``Backend.resize``, the path ``fleet resize`` takes;
the elastic step's resizes take the same one). The job is workers/examples/train_elastic.py (a small
MLP: its checkpoint is tiny, so this is the mechanism's cost, not a model's): resized 1 -> 2 -> 4 -> 2
-> 1 GPUs, each leg timed from the resize call to the old attempt's end (checkpointed and requeued),
to the new attempt running, and to its first training step logged. Then its batch alone changes at
the GPUs it holds (``fleet resize JOB --gpus 1 --batch-size 512``): the job follows it in place
(``fw.batch_size(follow=True)``), so that leg is timed to the step it logs the switch at, in the
same attempt.

Run: ``python -m bench.elastic`` (results go to BENCHMARKS.md by hand).
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

from bench.dispatch import machine_line, redis_server
from bench.procs import DirectClient, until
from bench.recovery import fleet
from fleet import JobSpec, JobState
from fleet.progress import follows_batch

EXAMPLE = str(Path(__file__).resolve().parents[1] / "workers" / "examples" / "train_elastic.py")
SIZES = (2, 4, 2, 1)
#: the batch the last leg changes to in place (the job starts at the range's smallest, 128)
IN_PLACE_BATCH = 512


def spec(done: Path) -> JobSpec:
    command = [
        sys.executable,
        EXAMPLE,
        "--steps",
        "1000000",
        "--every",
        "5",
        "--sleep",
        "0.05",
        "--done-file",
        str(done),
    ]
    return JobSpec.parse(
        {
            "name": "bench-elastic",
            "command": command,
            "gpus": {"min": 1, "max": 4},
            "batch_size": {"min": 128, "max": 1024},
            "profile": "cifar10",
        }
    )


def first_step(client: DirectClient, job_id: str, attempt: int) -> float | None:
    """When the attempt's first training step was shipped (unix seconds), or None yet."""
    for line in client.logs(job_id, attempt):
        if re.match(r"step \d+ loss", line.line):
            return line.at
    return None


def checkpointed(client: DirectClient, job_id: str, attempt: int) -> bool:
    return any(line.line.startswith("fleet-progress") for line in client.logs(job_id, attempt))


def legs(
    client: DirectClient, job_id: str, done: Path
) -> list[tuple[str, float | None, float | None, float]]:
    """(what, to requeued, to running, to training) seconds of each resize."""
    out: list[tuple[str, float | None, float | None, float]] = []
    old = 1
    for attempt, gpus in enumerate(SIZES, start=1):
        until(lambda a=attempt: checkpointed(client, job_id, a), "a checkpoint", timeout=120)
        asked = time.time()
        client.resize(job_id, gpus)
        until(lambda a=attempt: client.get(job_id).attempt > a, "a new attempt", timeout=120)
        training = until(lambda a=attempt: first_step(client, job_id, a + 1), "a first step", timeout=120)
        events = client.history(job_id)
        requeued = next(e.at for e in events if e.state == JobState.QUEUED and e.attempt == attempt)
        running = next(e.at for e in events if e.state == JobState.RUNNING and e.attempt == attempt + 1)
        out.append((f"{old} -> {gpus} GPUs", requeued - asked, running - asked, training - asked))
        old = gpus
    out.append(in_place(client, job_id, len(SIZES) + 1, old, IN_PLACE_BATCH))
    done.touch()
    assert client.wait(job_id, timeout=120).state == JobState.SUCCEEDED
    return out


def switched(client: DirectClient, job_id: str, attempt: int, batch: int) -> float | None:
    """When the attempt logged its switch to ``batch`` in place (unix seconds), or None yet."""
    for line in client.logs(job_id, attempt):
        if re.match(rf"batch \d+ -> {batch} in place", line.line):
            return line.at
    return None


def in_place(
    client: DirectClient, job_id: str, attempt: int, gpus: int, batch: int
) -> tuple[str, float | None, float | None, float]:
    """A change of the batch alone, at the GPUs it holds: no requeue and no new attempt (None), to
    training at the new batch. Asked once the attempt has said it follows (its first report): until
    then fleet cannot know it would, and restarts it instead."""
    until(lambda: follows_batch(client.get(job_id).progress), "a report that it follows", timeout=120)
    asked = time.time()
    client.resize(job_id, gpus, batch)
    at = until(lambda: switched(client, job_id, attempt, batch), "the switch in place", timeout=120)
    job = client.get(job_id)
    assert job.attempt == attempt and job.batch_size == batch, (job.attempt, job.batch_size)
    return (f"batch -> {batch} at {gpus} GPU, in place", None, None, at - asked)


def cell(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def main() -> None:
    with redis_server() as url:
        print(machine_line("elastic resize, live"))
        procs, client = fleet(url, {"FLEET_CONTROLLER__ELASTIC": "false", "FLEET_AGENT__STOP_GRACE_S": "30"})
        try:
            procs.controller()
            procs.agent("bench-e", gpus=4)
            until(lambda: sum(n.alive for n in client.nodes()) >= 1)
            done = procs.root / "done"
            job = client.submit(spec(done))
            rows = legs(client, job.id, done)
        finally:
            procs.stop()
        print("| resize | to checkpointed and requeued s | to running again s | to training again s |")
        print("|---|---|---|---|")
        for what, requeued, running, training in rows:
            print(f"| {what} | {cell(requeued)} | {cell(running)} | {training:.2f} |")
        restarts = rows[: len(SIZES)]
        medians = [statistics.median(r[i] or 0.0 for r in restarts) for i in (1, 2, 3)]
        print(f"| median of the restarts | {medians[0]:.2f} | {medians[1]:.2f} | {medians[2]:.2f} |")


if __name__ == "__main__":
    main()
