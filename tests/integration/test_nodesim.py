"""The node simulator (bench/nodesim.py) keeps the agent's promises under the real controller:
every job runs once and succeeds once, multi-node jobs as one member per node, and no GPU ever
holds two attempts."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict

import pytest

from bench.nodesim import NodeSim
from bench.simfleet import SECONDS_LABEL, Group
from fleet.api.backend import Backend
from fleet.bus import Bus
from fleet.config import load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.models import Job, JobSpec, JobState
from fleet.state import JobStore, NodeStore, connect

pytestmark = pytest.mark.integration


#: one job in ten a gang: 2 nodes x 8 GPUs pinned, 16 GPUs split by the scheduler (2 x 8), 3 x 4
GANGS: list[dict[str, int]] = [{"nodes": 2, "gpus_per_node": 8}, {"gpus": 16}, {"nodes": 3, "gpus": 12}]


def mixed_jobs(count: int, seed: int = 7) -> list[JobSpec]:
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        model = rng.choice([None, None, "H100", "A100"])
        shape = rng.choice(GANGS) if rng.random() < 0.1 else {"gpus": rng.choice([1, 1, 2, 4, 8])}
        specs.append(
            JobSpec.parse(
                {
                    "name": f"sim-{i}",
                    "command": ["true"],
                    "gpu_model": model,
                    **shape,
                    "labels": {SECONDS_LABEL: f"{rng.uniform(0, 0.2):.3f}"},
                }
            )
        )
    return specs


def gpus_of(job: Job) -> list[str]:
    """Every GPU of the job's attempt: each member's on its node, or its one node's."""
    return [uuid for m in job.members for uuid in m.gpus] or job.gpus


def overlaps(jobs: list[Job]) -> list[str]:
    """GPUs that two jobs held at once, from the stored records (RUNNING until final)."""
    by_gpu: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for job in jobs:
        assert job.started_at is not None and job.finished_at is not None
        for uuid in gpus_of(job):
            by_gpu[uuid].append((job.started_at, job.finished_at, job.id))
    found = []
    for uuid, spans in by_gpu.items():
        spans.sort()
        found += [f"{uuid}: {a[2]} and {b[2]}" for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    return found


def story(store: JobStore, job: Job) -> str:
    """A job's history, one line per transition, for a failure message."""
    return f"{job.id}:\n" + "\n".join(
        f"  {e.state} {e.attempt} {e.node} {e.reason}" for e in store.history(job.id)
    )


@pytest.mark.parametrize("consumer", ["shared", "dramatiq"])
def test_every_job_succeeds_once_on_simulated_nodes(redis_url: str, consumer: str) -> None:
    # Given 20 simulated nodes (10 A100, 10 H100, 8 GPUs each) and the real controller
    settings = load_settings(
        redis_url=redis_url, bus_poll_ms=10, controller={"schedule_interval_s": 0.5, "metrics_port": 0}
    )
    keys = Keys(settings.key_prefix)
    store = JobStore(connect(settings), keys)
    controller = Controller(settings, store, NodeStore(connect(settings), keys), Bus(settings))
    thread = threading.Thread(target=controller.run, daemon=True)
    groups = [Group(10, 8, "Sim A100 80GB", "a100"), Group(10, 8, "Sim H100 80GB", "h100")]
    client = Backend(settings=settings)
    with NodeSim(settings, groups, consumer=consumer, reconcile_s=1.0) as sim:
        thread.start()
        # When 200 jobs are submitted: 1 to 8 GPUs, and one in ten on 2 or 3 nodes (2 x 8, 16, 3 x 4
        # GPUs), some bound to a GPU model
        ids = [client.submit(spec).id for spec in mixed_jobs(200)]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(sim.stats.succeeded) < len(ids):
            time.sleep(0.2)
        summary = sim.summary()
    controller.stop_event.set()
    thread.join(timeout=10)

    # Then every job SUCCEEDED once, on its first attempt, and the simulator ended each exactly once
    jobs = store.get_many(ids)
    assert [story(store, j) for j in jobs if j.state != JobState.SUCCEEDED or j.attempt != 1] == [], summary
    assert [i for i in ids if sim.stats.succeeded[i] != 1] == []
    assert [i for i in ids if [e.state for e in store.history(i)].count("SUCCEEDED") != 1] == []
    # And no GPU was claimed twice: neither at launch (the simulated GPUs) nor in the records
    assert sim.stats.conflicts == []
    assert overlaps(jobs) == []
    assert store.redis.hlen(keys.claims) == 0
    h100 = [j for j in jobs if j.spec.gpu_model == "H100"]
    assert h100 and all(n.startswith("h100-") for j in h100 for n in j.nodes_held)
    # And each multi-node job ran as one member per node, on distinct nodes, each member's GPUs its
    # node's; every member but the last to end was done while the others ran
    gangs = [j for j in jobs if j.spec.gpus > 8 or (j.spec.nodes or 1) > 1]
    assert len(gangs) >= 10
    shapes = {j.id: [len(m.gpus) for m in j.members] for j in gangs}
    want = {j.id: [j.spec.gpus // (j.spec.nodes or 2)] * (j.spec.nodes or 2) for j in gangs}
    assert shapes == want
    assert [j.id for j in gangs if len(set(j.nodes_held)) != len(j.members)] == []
    assert [
        j.id for j in gangs if any(not g.startswith(f"GPU-{m.node}-") for m in j.members for g in m.gpus)
    ] == []
    assert sim.stats.members_done == sum(len(j.members) - 1 for j in gangs)
    client.close()
