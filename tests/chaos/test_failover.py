"""The failover test, in the style of Jepsen: the fleet's Redis primary is SIGKILLed, or cut off from
everyone by a network partition, at random moments under steady load, and Sentinel promotes a
replica each time. Then what the users were told, what the jobs recorded of their own runs and the
fleet's final state are checked against each other (:mod:`tests.chaos.checker`): every acknowledged
submit exists and ended, every acknowledged cancel took effect, no job did its work twice or ran
twice at once, no GPU was held by two runs at once, and no claim is left.

A primary, two replicas and three sentinels (``fleet up --ha``'s, down after 1 s), two controllers,
an API and three agents of 4 simulated GPUs (process runtime), with the services' own lease timings;
three users' scripts submit through the API (a GPU job of 5-30 s one time in three, else a short
one of CPUs only) and cancel some of their jobs, retrying what the API could not complete. It
prints, per failover, the seconds from the fault to the promotion, to the first acknowledged submit
and to the first placement.

Reproducible from ``FLEET_FAILOVER_SEED``: ``FLEET_FAILOVER_ROUNDS`` rounds (default 1), each a kill
and a partition in an order drawn from the seed, ``FLEET_FAILOVER_GAP_S`` seconds of load before each
(a range, default 2-4) and jobs of ``FLEET_FAILOVER_JOB_S`` seconds (default 1-3). The suite runs
that short version; ``make chaos-failover`` a long one (3 rounds, six failovers).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from bench.procs import DirectClient, FleetProcs
from fleet.client import Client
from fleet.config import load_settings
from fleet.models import Role
from fleet.state import Stores
from tests.chaos.checker import FINAL, check
from tests.chaos.failover import ACKNOWLEDGED, Cluster, Fault, Load, history, median, recovery
from tests.conftest import need
from tests.support import start_api, wait_for


def _range(name: str, default: str) -> tuple[float, float]:
    low, _, high = os.environ.get(name, default).partition("-")
    return float(low), float(high or low)


ROUNDS = int(os.environ.get("FLEET_FAILOVER_ROUNDS", "1"))
SEED = int(os.environ.get("FLEET_FAILOVER_SEED", "20250601"))
GAP_S = _range("FLEET_FAILOVER_GAP_S", "2-4")
JOB_S = _range("FLEET_FAILOVER_JOB_S", "1-3")
NODES = ("f-a", "f-b", "f-c")
#: each failover takes its gap, up to a minute for the Redis set to settle, and the jobs up to 5 min to end
pytestmark = [pytest.mark.integration, pytest.mark.timeout(int(420 + 2 * ROUNDS * (GAP_S[1] + 60)))]
#: the services' own defaults, not the tests' fast ones: a failover (a few seconds) must not outlast
#: a node's lease, or every agent fences its jobs, as it would in production with a 3 s lease
LEASES = {
    "FLEET_CONTROLLER__LEADER_LEASE_S": "5",
    "FLEET_AGENT__HEARTBEAT_INTERVAL_S": "1",
    "FLEET_AGENT__NODE_LEASE_TTL_S": "10",
    "FLEET_AGENT__FENCE_MARGIN_S": "2",
    # a Launch message lost with a primary is mended from Redis after these (30 s and 60 s by default)
    "FLEET_CONTROLLER__RESYNC_INTERVAL_S": "3",
    "FLEET_CONTROLLER__SCHEDULED_TIMEOUT_S": "15",
}


def test_failovers_lose_no_acknowledged_write_and_run_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    rng = random.Random(SEED)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the jobs run as the unprivileged job user
    cluster = Cluster(tmp_path / "redis")
    for name, value in cluster.ha.env().items():
        monkeypatch.setenv(name, value)
    procs = FleetProcs(cluster.ha.url, tmp_path, "process")
    procs.env.update(LEASES)
    settings = load_settings()
    direct = DirectClient(settings=settings)
    stores = Stores.open(settings)
    token, _ = stores.tokens.create("chaos", "default", Role.USER)
    stores.close()
    load: Load | None = None
    client: Client | None = None
    try:
        procs.controller("controller-a")
        procs.controller("controller-b")
        for node in NODES:
            procs.agent(node, gpus=4)
        client = Client(start_api(procs, "api"), token)
        procs.wait_nodes(direct, len(NODES), timeout=60)
        # Given users submitting and cancelling through the API
        load = Load(client, out, random.Random(rng.random()), JOB_S)
        load.start()
        # When the primary is killed, or partitioned, at random moments, and a replica promoted each time
        faults: list[Fault] = []
        kinds = ["kill", "partition"] * ROUNDS
        rng.shuffle(kinds)
        for kind in kinds:
            time.sleep(rng.uniform(*GAP_S))
            faults.append(cluster.kill() if kind == "kill" else cluster.partition(hold_s=rng.uniform(1, 3)))
            cluster.settled()
        time.sleep(rng.uniform(*GAP_S))  # load after the last failover too
        load.stop()
        # Then every job ends, and the GPUs come free
        _drain(direct, procs)
        wait_for(lambda: not any(n.claims for n in direct.nodes()), timeout=60, what="no claim", procs=procs)
        (tmp_path / "calls.jsonl").write_text("".join(json.dumps(vars(c)) + "\n" for c in load.calls))
        found = history(direct, load, out)
        violations = check(found)
        placed = [e.at for job in found.final for e in direct.history(job) if e.state == "SCHEDULED"]
        report = recovery(faults, load.calls, placed)
        _print(report, found.submitted, found.cancelled, len(found.runs), violations, load)
        # And the checker finds every promise kept, and every call was acknowledged in the end
        assert violations == [], procs.logs()
        assert load.failed() == []
        # And the fleet took submits and placed jobs again after every failover
        assert len(report) == 2 * ROUNDS
        assert all(r["first_submit_s"] is not None and r["placements_s"] is not None for r in report), report
        assert found.cancelled and len(found.submitted) > len(found.cancelled)
    finally:
        if load is not None:
            load.stop()
        if client is not None:
            client.close()
        procs.stop()
        direct.close()
        cluster.close()


def _drain(direct: DirectClient, procs: FleetProcs, stall_s: float = 120.0) -> None:
    """Wait for every job to end. A long run leaves minutes of queued GPU work behind its load, so a
    fixed deadline fails a fleet that is only busy: fail when no job ended for ``stall_s`` (a job
    stuck, not a queue draining), naming those still open (the test's own timeout bounds the rest)."""
    ended_at, open_before = time.monotonic(), -1
    while True:
        still = [f"{j.id} {j.state.value}" for j in direct.jobs(limit=100_000) if j.state.value not in FINAL]
        if not still:
            return
        if len(still) != open_before:
            ended_at, open_before = time.monotonic(), len(still)
        stalled = time.monotonic() - ended_at
        assert stalled < stall_s, f"no job ended for {stall_s:.0f}s; still open: {still[:20]}\n{procs.logs()}"
        time.sleep(0.5)


def _print(
    report: list[dict[str, object]],
    submitted: set[str],
    cancelled: set[str],
    runs: int,
    violations: list[str],
    load: Load,
) -> None:
    lost = [v for v in violations if "job lost" in v or "still" in v]
    twice = [v for v in violations if "times" in v or "overlapped" in v]
    summary = {
        "seed": SEED,
        "rounds": ROUNDS,
        "failovers": len(report),
        "median_first_submit_s": median([r["first_submit_s"] for r in report]),  # type: ignore[misc]
        "median_placements_s": median([r["placements_s"] for r in report]),  # type: ignore[misc]
        "submits_acknowledged": len(submitted),
        "cancels_acknowledged": len(cancelled),
        "tries": len(load.calls),
        "tries_not_acknowledged": sum(c.outcome not in ACKNOWLEDGED for c in load.calls),
        "runs": runs,
        "lost": len(lost),
        "duplicated": len(twice),
        "violations": len(violations),
    }
    print("\nfailover test:", json.dumps(summary))
    for line in report:
        print("  ", json.dumps(line))
    for violation in violations:
        print("  violation:", violation)
