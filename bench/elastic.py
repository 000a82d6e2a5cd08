"""What a resize costs live: SIGTERM -> checkpoint -> requeue -> relaunch -> training again.

One agent with 4 simulated GPUs, the process runtime, the controller's elastic step off (so the
resizes happen when the benchmark asks, through ``Backend.resize``, the path ``fleet resize`` takes;
the elastic step's resizes take the same one). The job is workers/examples/train_elastic.py (a small
MLP: its checkpoint is tiny, so this is the mechanism's cost, not a model's): resized 1 -> 2 -> 4 -> 2
-> 1 GPUs, each leg timed from the resize call to the old attempt's end (checkpointed and requeued),
to the new attempt running, and to its first training step logged.

Run: ``python -m bench.elastic`` (results go to BENCHMARKS.md by hand).
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

from bench.dispatch import machine_line, redis_server
from bench.procs import DirectClient
from bench.recovery import fleet, until
from fleet import JobSpec, JobState

EXAMPLE = str(Path(__file__).resolve().parents[1] / "workers" / "examples" / "train_elastic.py")
SIZES = (2, 4, 2, 1)


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


def legs(client: DirectClient, job_id: str, done: Path) -> list[tuple[str, float, float, float]]:
    """(what, to requeued, to running, to training) seconds of each resize."""
    out = []
    old = 1
    for attempt, gpus in enumerate(SIZES, start=1):
        until(lambda a=attempt: checkpointed(client, job_id, a), timeout=120)
        asked = time.time()
        client.resize(job_id, gpus)
        until(lambda a=attempt: client.get(job_id).attempt > a, timeout=120)
        until(lambda a=attempt: first_step(client, job_id, a + 1) is not None, timeout=120)
        events = client.history(job_id)
        requeued = next(e.at for e in events if e.state == JobState.QUEUED and e.attempt == attempt)
        running = next(e.at for e in events if e.state == JobState.RUNNING and e.attempt == attempt + 1)
        training = first_step(client, job_id, attempt + 1) or 0.0
        out.append((f"{old} -> {gpus}", requeued - asked, running - asked, training - asked))
        old = gpus
    done.touch()
    assert client.wait(job_id, timeout=120).state == JobState.SUCCEEDED
    return out


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
            print(f"| {what} GPUs | {requeued:.2f} | {running:.2f} | {training:.2f} |")
        medians = [statistics.median(r[i] for r in rows) for i in (1, 2, 3)]
        print(f"| median | {medians[0]:.2f} | {medians[1]:.2f} | {medians[2]:.2f} |")


if __name__ == "__main__":
    main()
