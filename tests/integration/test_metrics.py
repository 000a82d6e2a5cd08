"""Prometheus metrics, scraped over HTTP from the real services."""

from __future__ import annotations

import re
import time
import urllib.request

import psutil
import pytest

from fleet import Client, JobSpec, JobState
from fleet.ops.local import free_port
from tests.conftest import FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_controller_and_agent_metrics(procs: FleetProcs, client: Client) -> None:
    cport, aport = free_port(), free_port()
    procs.env["FLEET_CONTROLLER__METRICS_PORT"] = str(cport)
    procs.one_node(client, "t-m", gpus=2, FLEET_AGENT__METRICS_PORT=str(aport))
    done = client.submit(JobSpec(name="ok", gpus=1, command=["true"]))
    assert done.wait(timeout=30).state == JobState.SUCCEEDED
    flaky = client.submit(JobSpec(name="flaky", gpus=1, max_attempts=2, command=["sh", "-c", "exit 1"]))
    assert flaky.wait(timeout=30).state == JobState.FAILED
    running = client.submit(JobSpec(name="busy", gpus=1, command=["sleep", "60"]))
    client.set_tenant("research")
    big = JobSpec(name="big", gpus=3, priority=5, tenant="research", command=["true"], allow_unplaceable=True)
    waiting = client.submit(big)
    wait_for(lambda: running.status().state == JobState.RUNNING, what="running")
    time.sleep(0.5)

    c = scrape(cport)
    assert c['fleet_jobs{state="SUCCEEDED"}'] == 1 and c['fleet_jobs{state="FAILED"}'] == 1
    assert c['fleet_jobs{state="RUNNING"}'] == 1
    assert c['fleet_jobs_queued{priority="5",tenant="research"}'] == 1
    assert c['fleet_gpus{status="total"}'] == 2 and c['fleet_gpus{status="claimed"}'] == 1
    assert c['fleet_nodes{state="READY"}'] == 1
    assert c['fleet_requeues{kind="job_failure"}'] == 1
    assert c["fleet_schedule_pass_seconds_count"] >= 1
    assert c["fleet_redis_memory_bytes"] > 100_000  # an empty redis-server holds ~1 MB

    a = scrape(aport)
    assert a['fleet_agent_attempts_running{node="t-m"}'] == 1
    assert 0 <= a['fleet_agent_heartbeat_lag_seconds{node="t-m"}'] < 2
    gpu_totals = [v for k, v in a.items() if re.match(r'fleet_agent_gpu_memory_total_bytes\{.*node="t-m"', k)]
    assert gpu_totals == [80 * (1 << 30)] * 2
    # And neither serves its unauthenticated /metrics beyond loopback unless the operator says so
    listening = {
        (c.laddr.ip, c.laddr.port)
        for p in psutil.Process().children(recursive=True)
        for c in p.net_connections("tcp")
        if c.status == "LISTEN"
    }
    assert {("127.0.0.1", cport), ("127.0.0.1", aport)} <= listening
    assert not [a for a in listening if a[1] in (cport, aport) and a[0] != "127.0.0.1"]
    running.cancel()
    waiting.cancel()
