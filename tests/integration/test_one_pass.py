"""The simulator and the controller run one pass (``fleet.scheduler.passes.run_pass``): fed the same
trace, a live controller (real Redis, a fake clock, two simulated nodes whose agents this test plays)
and ``fleet sim`` decide the same placements, resizes and preemptions, in the same order."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from fleet.lifecycle import decide
from fleet.models import Exit, ExitKind, Fault, JobSpec, JobState, Tenant
from fleet.scheduler.profiles import named_profile
from fleet.sim import SimConfig, Simulation
from fleet.sim.engine import PASSES_PER_INSTANT
from fleet.sim.traces import TraceJob
from fleet.state.tenants import TenantStore
from tests.integration.inprocess import Harness

pytestmark = pytest.mark.integration
NODES, PER_NODE = ("n000", "n001"), 4
#: a and b share 2 nodes of 4 GPUs; b is guaranteed 6 GPUs, a may hold 6
TENANTS = {
    "a": Tenant(name="a", max_gpus=6, min_run_s=60),
    "b": Tenant(name="b", guaranteed_gpus=6, min_run_s=60),
}
#: elastic jobs train imagenet (hours: none ends within the trace); fixed ones run for days
LONG_S = 10 * 86_400.0
TRACE = [
    TraceJob("e1", "a", 0.0, gpus=0, batch=0, model="imagenet"),
    TraceJob("f1", "a", 0.0, gpus=2, batch=0, duration=LONG_S),
    TraceJob("g1", "b", 300.0, gpus=4, batch=0, duration=LONG_S),
    TraceJob("e2", "b", 450.0, gpus=0, batch=0, model="imagenet"),
    TraceJob("f2", "a", 700.0, gpus=1, batch=0, duration=LONG_S),
    TraceJob("g2", "b", 800.0, gpus=2, batch=0, duration=LONG_S),
]
UNTIL = 1000.0
Decision = tuple[float, str, str, int]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulated() -> tuple[list[Decision], list[float]]:
    """What ``fleet sim`` decides, and the instants it ran passes at."""
    gpus = len(NODES) * PER_NODE
    config = SimConfig(
        "elastic",
        gpus=gpus,
        nodes=len(NODES),
        until=UNTIL,
        tenants=TENANTS,
        max_gpus=gpus,
        objective="speedup",
        resize_cost_s=30,
        min_interval_s=120,
    )
    sim = Simulation(TRACE, config)
    instants: list[float] = []
    run_pass = sim._pass

    def recorded() -> None:
        instants.append(sim.now)
        run_pass()

    sim._pass = recorded  # type: ignore[method-assign]
    sim.run()
    return [d for d in sim.decisions if d[1] != "ended"], instants


@pytest.fixture
def harness(redis_url: str) -> Iterator[tuple[Harness, Clock]]:
    clock = Clock()
    elastic = {"elastic_interval_s": 0.001, "resize_cost_s": 30, "elastic_min_interval_s": 120}
    h = Harness(redis_url, clock, controller=elastic)
    yield h, clock
    h.close()


def spec(job: TraceJob) -> JobSpec:
    if job.model is None:
        return JobSpec(name=job.id, command=["sleep", "inf"], gpus=job.gpus, tenant=job.tenant)
    p = named_profile(job.model)
    return JobSpec.parse(
        {
            "name": job.id,
            "command": ["python", "train.py"],
            "tenant": job.tenant,
            "gpus": {"min": 1, "max": len(NODES) * PER_NODE},
            "profile": job.model,
            "batch_size": {"min": p.min_batch, "max": p.max_batch},
        }
    )


def live_pass(h: Harness, now: float, caplog: pytest.LogCaptureFixture) -> tuple[list[Decision], set[str]]:
    """One controller pass: what it decided (resizes, placements, preemptions, in the pass's order)
    and the jobs it asked to leave."""
    caplog.clear()
    plan = h.controller.schedule_pass()
    resized, preempted = [], []
    for record in caplog.records:
        message = record.getMessage()
        job = re.search(r"\bjob=(\S+)", message)
        if message.startswith("job_resized") and "running=True" in message and job:
            resized.append(job.group(1))
        elif message.startswith("job_preempted") and job:
            preempted.append(job.group(1))
    placed: dict[str, int] = {}
    for p in plan.placements:
        placed[p.job_id] = placed.get(p.job_id, 0) + len(p.gpus)
    jobs = {j: h.jobs.get(j) for j in [*resized, *preempted]}
    decisions = [(now, "resized", j, jobs[j].resize_gpus or 0) for j in resized]
    decisions += [(now, "placed", j, gpus) for j, gpus in placed.items()]
    decisions += [(now, "preempted", j, jobs[j].gpu_count) for j in preempted]
    return decisions, {*resized, *preempted}


def agents(h: Harness, now: float, started: list[str], leaving: set[str]) -> None:
    """What the nodes' agents do at once: start what was placed, end what was asked to leave (a
    requeue without spending a retry, at its new size after a resize)."""
    for job_id in started:
        attempt = h.jobs.get(job_id).attempt
        for to, fields in ((JobState.STARTING, {}), (JobState.RUNNING, {"started_at": now})):
            assert h.jobs.transition(
                job_id,
                attempt=attempt,
                to=to,
                now=now,
                reason="",
                fields=fields,
                allowed=[JobState.SCHEDULED, JobState.STARTING],
            )
    for job_id in leaving:
        job = h.jobs.get(job_id)
        kind = ExitKind.RESIZE if job.resize_gpus is not None else ExitKind.PREEMPTED
        reason = f"{job.preempt}: exited with code 143 (SIGTERM)"
        exit = Exit(code=143, fault=Fault.INFRA, kind=kind, reason=reason)
        assert h.jobs.end_attempt(job, exit, decide(job, exit, h.controller.policy), now)
    h.controller.touch(jobs=[*started, *leaving], nodes=NODES)


def test_the_simulator_and_the_controller_decide_the_same(
    harness: tuple[Harness, Clock], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    expected, instants = simulated()
    kinds = {what for _, what, _, _ in expected}
    assert kinds == {"placed", "resized", "preempted"}, expected  # the trace exercises every decision
    h, clock = harness
    tenants = TenantStore(h.client, h.jobs.keys)
    for tenant in TENANTS.values():
        tenants.set(tenant)
    for node in NODES:
        h.node(node, ttl_s=3600, gpus=PER_NODE)
    h.lead()
    decided: list[Decision] = []
    arrivals = sorted(TRACE, key=lambda j: j.arrival)
    with caplog.at_level(logging.INFO, logger="fleet.controller"):
        for now in sorted(set(instants)):
            clock.now = now
            h.controller.refresh_tenants()  # usage folded up to now, as the simulator accrues it
            for job in [j for j in arrivals if j.arrival <= now]:
                h.jobs.create(job.id, spec(job), now)
                h.controller.touch(jobs=[job.id])
                arrivals.remove(job)
            for _ in range(PASSES_PER_INSTANT):
                decisions, leaving = live_pass(h, now, caplog)
                decided += decisions
                agents(h, now, [j for _, what, j, _ in decisions if what == "placed"], leaving)
                if not leaving:
                    break
    assert decided == expected
