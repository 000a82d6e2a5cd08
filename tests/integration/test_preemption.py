"""A tenant below its guarantee gets its GPUs back from one that filled the fleet: the other's jobs
checkpoint on SIGTERM, go back to the queue without spending a retry, and resume where they were."""

from __future__ import annotations

import sys
import time

import pytest
import redis

from fleet import Client, JobSpec, JobState
from fleet.keys import Keys
from fleet.models import Tenant
from fleet.state.tenants import TenantStore
from tests.conftest import FleetProcs
from tests.integration.test_dependability import STEPS, progress
from tests.support import wait_for

pytestmark = pytest.mark.integration
GRACE_S = 20.0


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.mark.timeout(600)  # 124 jobs; its own waits allow that long, the suite's 120 s guard not
def test_a_tenant_below_its_guarantee_preempts_one_above_its_share_and_the_victims_resume(
    procs: FleetProcs, client: Client, redis: redis.Redis
) -> None:
    # Given tenant a (weight 1) and tenant b (weight 3, guaranteed 2 GPUs), short minimum run times
    tenants = TenantStore(redis, Keys())
    tenants.set(Tenant(name="a", weight=1, min_run_s=1, preempt_grace_s=GRACE_S))
    tenants.set(Tenant(name="b", weight=3, guaranteed_gpus=2, min_run_s=1, preempt_grace_s=GRACE_S))
    procs.env.update(FLEET_CONTROLLER__USAGE_INTERVAL_S="1")
    procs.controller()
    procs.agent("t-a", gpus=2)
    procs.agent("t-b", gpus=2)
    procs.wait_nodes(client, 2)
    # And a's 40 jobs: four training jobs filling all 4 GPUs, checkpointing every 10 steps, and 36
    # short ones queued behind them
    train = [sys.executable, STEPS, "--steps", "200", "--every", "10", "--sleep", "0.05"]
    train += ["--resumed-sleep", "0"]  # a resumed attempt runs through: nothing is waited for then
    a_jobs = [client.submit(JobSpec(name=f"a{i}", gpus=1, command=train, tenant="a")) for i in range(4)]
    wait_for(
        lambda: all(max(progress(client, j.id, 1), default=0) >= 20 for j in a_jobs),
        timeout=120,
        what="a's jobs running and checkpointing",
    )
    short = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    a_rest = [client.submit(JobSpec(name=f"a{i}", gpus=1, command=short, tenant="a")) for i in range(4, 40)]
    # When b submits 10 jobs of a few seconds
    b_run = [sys.executable, "-c", "import time; time.sleep(3)"]
    b_jobs = [client.submit(JobSpec(name=f"b{i}", gpus=1, command=b_run, tenant="b")) for i in range(10)]
    started = time.monotonic()
    # Then within one grace period b runs its guarantee, on GPUs two of a's jobs gave up
    wait_for(
        lambda: sum(j.status().state in (JobState.RUNNING, JobState.SUCCEEDED) for j in b_jobs) >= 2,
        timeout=GRACE_S,
        what=f"b's jobs running:\n{procs.logs()}",
    )
    assert time.monotonic() - started <= GRACE_S
    preempted = [j for j in a_jobs if j.status().infra_requeues or j.status().preempt]
    assert len(preempted) == 2, [j.status() for j in a_jobs]
    # And every job of a ends well; the preempted ones resumed from their checkpoints, no retry spent
    for job in [*a_jobs, *a_rest, *b_jobs]:
        status = job.wait(timeout=240)
        assert status.state == JobState.SUCCEEDED and status.failures == 0, procs.logs()
    for job in preempted:
        status = job.status()
        assert (status.attempt, status.infra_requeues) == (2, 1)
        stopped_at = progress(client, job.id, 1)[-1]
        assert f"resumed from step {stopped_at} (attempt 2)" in job.logs(attempt=2)
        requeue = next(e for e in job.history() if e.state == "QUEUED" and e.attempt == 1)
        assert requeue.reason.startswith("preempted for job b")
        assert (
            "of tenant b (below its guarantee of 2 GPUs): exited with code 143 (SIGTERM); "
            "requeued (retry budget not spent)" in requeue.reason
        )
    assert all(j.status().state == JobState.SUCCEEDED for j in b_jobs)
    # And the preemptions are counted for a, and the tenants' status is published
    preempted_all = sum(j.status().infra_requeues for j in [*a_jobs, *a_rest])
    assert tenants.preemption_counts() == {"a": preempted_all} and preempted_all >= 2
    status = {s.tenant.name: s for s in tenants.status()}
    assert status["b"].tenant.guaranteed_gpus == 2 and status["a"].usage_gpu_s > 0
