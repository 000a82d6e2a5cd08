"""Chaos soak: 3 agents, 20 checkpointing jobs, random SIGKILLs of agents, nodes, jobs and Redis,
and agents stopped (SIGSTOP) for longer than their lease while their jobs run on.

At the end every job SUCCEEDED and finished its work exactly once, no two attempts of a job
overlapped in time (as the jobs themselves recorded it), no GPU claim leaked, and every requeue
has its reason in the history.

The chaos is bounded and reproducible: ``FLEET_SOAK_ROUNDS`` rounds (default 3), each one of every
fault in an order and at intervals drawn from ``FLEET_SOAK_SEED`` (default fixed), so a run's length
does not depend on the luck of the draw and a failure replays. ``FLEET_SOAK_ROUNDS=30`` and a seed of
your own run a longer, different soak.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.procs import DirectClient, FleetProcs
from fleet import JobSpec, JobState
from tests.integration.test_control_plane import OwnRedis
from tests.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROUNDS = int(os.environ.get("FLEET_SOAK_ROUNDS", "3"))
SEED = int(os.environ.get("FLEET_SOAK_SEED", "20250101"))
#: one round: every fault once, a job process twice (the cheapest fault, and the most common)
FAULTS = ("agent", "node", "pause", "job", "job", "redis")
#: enough 3-second jobs (on 1 or 2 of the 6 GPUs) to keep every GPU busy while the faults last
JOBS = 20
NODES = ("t-c1", "t-c2", "t-c3")

# A checkpointing job: 30 steps of 0.1 s, a checkpoint every 5, resume from the latest. It records
# each step's wall time per attempt (overlap check) and appends to DONE once when it completes.
JOB = """
import os, sys, time
import fleet_worker as fw
out = os.environ["OUT"]
job, attempt = fw.job_id(), fw.attempt()
resumed = fw.load_latest()
start = resumed[1] if resumed else 0
ticks = open(os.path.join(out, f"{job}.{attempt}.ticks"), "a")
for step in range(start, 30):
    ticks.write(f"{time.time()}\\n"); ticks.flush()
    time.sleep(0.1)
    if (step + 1) % 5 == 0:
        fw.save({"step": step + 1}, step + 1)
with open(os.path.join(out, f"{job}.done"), "a") as done:
    done.write(f"{attempt}\\n")
"""


def test_chaos_soak(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the jobs run as the unprivileged job user
    redis_server = OwnRedis(tmp_path)
    redis_server.start()
    procs = FleetProcs(redis_server.url, tmp_path, "process")
    procs.env["FLEET_RETRY_BACKOFF_S"] = "0.2"
    # what a lost message or launch costs before the controller mends it from Redis (30 s and 60 s
    # by default): a Redis killed at the wrong moment left the soak waiting minutes for it
    procs.env["FLEET_CONTROLLER__RESYNC_INTERVAL_S"] = "3"
    procs.env["FLEET_CONTROLLER__SCHEDULED_TIMEOUT_S"] = "15"
    client = DirectClient(redis_server.url)
    counts: Counter[str] = Counter()
    try:
        procs.controller()
        for node in NODES:
            procs.agent(node, gpus=2)
        procs.wait_nodes(client, 3)
        spec = {"command": [sys.executable, "-c", JOB], "env": {"OUT": str(out)}, "max_attempts": 20}
        jobs = [
            client.submit(JobSpec.parse({"name": f"soak{i}", "gpus": 1 + i % 2, **spec})) for i in range(JOBS)
        ]
        chaos = Chaos(procs, redis_server, rng, counts)
        faults = [fault for _ in range(ROUNDS) for fault in FAULTS]
        rng.shuffle(faults)
        for fault in faults:
            time.sleep(rng.uniform(0.5, 1.5))
            chaos.step(fault)
        chaos.heal()
        finished = [h.wait(timeout=300) for h in jobs]
        # every job succeeded exactly once, and no work past a checkpoint was done twice
        assert [j.state for j in finished] == [JobState.SUCCEEDED] * JOBS, procs.logs()
        for job in finished:
            assert [e.state for e in client.history(job.id)].count("SUCCEEDED") == 1
            _assert_completed_once(out, job.id)
            _assert_no_overlap(out, job.id, job.attempt)
        # no GPU claim leaked
        wait_for(lambda: all(not n.claims for n in client.nodes()), timeout=30, what="claims released")
        # every requeue says why
        requeues = [
            e for j in finished for e in client.history(j.id) if e.state == "QUEUED" and e.attempt > 0
        ]
        assert all(e.reason for e in requeues)
        counts["jobs"], counts["attempts"] = JOBS, sum(j.attempt for j in finished)
        counts["requeues"] = len(requeues)
        print(f"\nchaos soak (seed {SEED}):", json.dumps(dict(counts)))
    finally:
        procs.stop()
        client.close()
        redis_server.kill()


#: longer than the test lease (3 s): the node goes DOWN and its jobs are requeued elsewhere, while
#: the stopped agent's supervisor must have stopped them first
PAUSE_S = 4.5


class Chaos:
    """One fault per step: an agent killed or stopped past its lease, a whole node (back 2 s
    later), a job process, Redis."""

    def __init__(
        self, procs: FleetProcs, redis_server: OwnRedis, rng: random.Random, counts: Counter[str]
    ) -> None:
        self.procs, self.redis, self.rng, self.counts = procs, redis_server, rng, counts
        self.down: dict[str, float] = {}
        self.paused: dict[str, float] = {}

    def step(self, action: str) -> None:
        for node, since in list(self.down.items()):
            if time.monotonic() - since > 2:
                self.procs.agent(node, gpus=2)
                del self.down[node]
        for node, since in list(self.paused.items()):
            if time.monotonic() - since > PAUSE_S:
                self.procs.procs[node].send_signal(signal.SIGCONT)
                del self.paused[node]
        up = [n for n in NODES if n not in self.down and n not in self.paused]
        if action == "pause" and len(up) > 1:
            victim = self.rng.choice(up)
            self.procs.procs[victim].send_signal(signal.SIGSTOP)
            self.paused[victim] = time.monotonic()
            self.counts["stop agent past its lease"] += 1
        elif action in ("agent", "node") and len(up) > 1:
            self._kill(action, self.rng.choice(up))
        elif action == "job" and _kill_a_job(self.procs, self.rng):
            self.counts["kill job process"] += 1
        elif action == "redis":
            self.redis.kill()
            time.sleep(0.3)
            self.redis.start()
            self.counts["kill redis"] += 1

    def _kill(self, action: str, victim: str) -> None:
        if action == "node":
            self.procs.kill_node(victim)
            self.down[victim] = time.monotonic()
        else:
            self.procs.procs[victim].send_signal(signal.SIGKILL)
            self.procs.procs[victim].wait()
            self.procs.agent(victim, gpus=2)
        self.counts[f"kill {action}"] += 1

    def heal(self) -> None:
        for node in self.down:
            self.procs.agent(node, gpus=2)
        for node in self.paused:
            self.procs.procs[node].send_signal(signal.SIGCONT)


def _kill_a_job(procs: FleetProcs, rng: random.Random) -> bool:
    metas = list(procs.root.glob("t-c*/attempts/*/meta.json"))
    rng.shuffle(metas)
    for meta in metas:
        try:
            os.killpg(json.loads(meta.read_text())["pid"], signal.SIGKILL)
            return True
        except (ProcessLookupError, FileNotFoundError, ValueError):
            continue
    return False


def _assert_completed_once(out: Path, job_id: str) -> None:
    """The work completed once. A node may die after the job finished but before its exit was
    recorded; the requeued attempt then resumes from the final checkpoint and runs no step again
    (completion itself is at-least-once, as in any system that cannot see past a power cut)."""
    finishers = [int(a) for a in (out / f"{job_id}.done").read_text().split()]
    for attempt in finishers[1:]:
        ticks = out / f"{job_id}.{attempt}.ticks"
        assert not ticks.exists() or not ticks.read_text().split(), f"{job_id}: attempt {attempt} redid work"
    if len(finishers) > 1:
        print(f"{job_id}: completion repeated by attempts {finishers[1:]} resuming from the final checkpoint")


def _assert_no_overlap(out: Path, job_id: str, attempts: int) -> None:
    spans = []
    for attempt in range(1, attempts + 1):
        path = out / f"{job_id}.{attempt}.ticks"
        if path.exists() and (ticks := [float(t) for t in path.read_text().split()]):
            spans.append((min(ticks), max(ticks), attempt))
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert end < start, f"{job_id}: attempts {a} and {b} overlapped"
