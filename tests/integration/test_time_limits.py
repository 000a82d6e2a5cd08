"""Time limits: each attempt stopped at its wall-clock limit, with SIGTERM ahead of it on request,
then FAILED with the reason, or requeued without spending a retry for a checkpointing run."""

from __future__ import annotations

import sys

import pytest

from fleet import Client, JobSpec, JobState
from fleet.errors import SpecError
from tests.conftest import FleetProcs

pytestmark = pytest.mark.integration

#: reports when SIGTERM came and exits as a checkpointing job does (143), or runs to the end
TRAP = """
import os, signal, sys, time
start = time.monotonic()
def term(*_):
    print(f"SIGTERM after {time.monotonic() - start:.1f}s: checkpointing", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
if os.environ["FLEET_ATTEMPT"] != "1" and os.environ.get("QUICK_AFTER_FIRST"):
    print("attempt", os.environ["FLEET_ATTEMPT"], "finishes", flush=True)
    sys.exit(0)
time.sleep(600)
"""


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def fleet(procs: FleetProcs, client: Client) -> Client:
    procs.one_node(client, "t-a", gpus=1)
    return client


def test_signal_before_gives_the_job_time_to_checkpoint_before_the_limit(fleet: Client) -> None:
    spec = {"name": "ckpt", "command": [sys.executable, "-c", TRAP], "timeout": "6s", "signal_before": "4s"}
    job = fleet.submit(JobSpec.parse(spec))
    status = job.wait(timeout=60)
    # SIGTERM came about 6 - 4 = 2 s in (the agent looks every 0.5 s here), and the job's own
    # handler ran: it checkpointed and exited, and the job ended on its time limit
    line = next(line for line in job.logs().splitlines() if line.startswith("SIGTERM after"))
    assert 1.5 <= float(line.split()[2].rstrip("s:")) < 4.0, line
    assert (
        status.state == JobState.FAILED and "time limit of 6s reached: exited with code 143" in status.reason
    )


def test_requeue_on_timeout_resumes_in_a_new_attempt_without_spending_a_retry(fleet: Client) -> None:
    spec = {
        "name": "chunked",
        "command": [sys.executable, "-c", TRAP],
        "timeout": "2s",
        "requeue_on_timeout": True,
        "env": {"QUICK_AFTER_FIRST": "1"},
        "max_attempts": 1,
    }
    job = fleet.submit(JobSpec.parse(spec))
    status = job.wait(timeout=60)
    assert (status.state, status.attempt, status.failures, status.infra_requeues) == (
        JobState.SUCCEEDED,
        2,
        0,
        1,
    )
    requeued = next(e for e in job.history() if e.state == "QUEUED" and e.attempt == 1)
    assert (
        requeued.reason.startswith("time limit of 2s reached") and "retry budget not spent" in requeued.reason
    )
    assert job.logs(attempt=2) == "attempt 2 finishes"


def test_a_signal_before_longer_than_the_limit_is_refused_at_submit(fleet: Client) -> None:
    with pytest.raises(SpecError, match="signal_before: it must be shorter than timeout"):
        fleet.submit({"name": "x", "command": ["true"], "timeout": "1m", "signal_before": "2m"})
