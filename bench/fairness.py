"""Fair share and preemption, live: the real controller over simulated nodes (``bench/nodesim.py``).

``python -m bench.fairness`` runs two scenarios on one ``redis-server`` of its own, each on a fresh
fleet of ``--nodes`` x 8 simulated GPUs:

- **shares**: tenants ``a`` (weight 1) and ``b`` (weight 3), no guarantees, both with more short
  jobs (``--job-s`` seconds, 1 GPU) than the fleet can run for ``--seconds``: the GPU-seconds each
  tenant got per window, and overall after the first window. Weighted fair share says 25 / 75 %.
- **guarantee**: ``a`` fills every GPU with long checkpointing jobs (preemptible after its
  ``min_run_s``), then ``b``, guaranteed half the fleet, submits 20 jobs: how long until ``b``
  runs its guarantee, how many of ``a``'s jobs were preempted, and whether any spent a retry.

GPU-seconds come from the jobs' own records (``started_at`` to ``finished_at``, or now).
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from bench.dispatch import machine_line, redis_server
from bench.nodesim import NodeSim
from bench.scale import bulk_create
from bench.simfleet import SECONDS_LABEL, Group
from fleet.bus import Bus
from fleet.config import Settings, load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.models import Job, JobSpec, JobState, Tenant
from fleet.state import JobStore, NodeStore, connect
from fleet.state.tenants import TenantStore


@contextlib.contextmanager
def fleet(url: str, nodes: int) -> Iterator[tuple[Settings, JobStore, TenantStore]]:
    """A controller (in a thread) and ``nodes`` simulated 8-GPU nodes on the Redis at ``url``."""
    settings = load_settings(
        redis_url=url,
        bus_poll_ms=50,
        retry_backoff_s=0.5,
        controller={
            "schedule_interval_s": 0.5,
            "metrics_port": 0,
            "usage_interval_s": 1.0,
            "fair_share_half_life_s": 600.0,
        },
    )
    client = connect(settings)
    client.flushall()
    keys = Keys(settings.key_prefix)
    store, tenants = JobStore(client, keys), TenantStore(client, keys)
    controller = Controller(
        settings, JobStore(connect(settings), keys), NodeStore(connect(settings), keys), Bus(settings)
    )
    thread = threading.Thread(target=controller.run, daemon=True)
    with NodeSim(settings, [Group(nodes, 8)], reconcile_s=1.0):
        thread.start()
        try:
            yield settings, store, tenants
        finally:
            controller.stop_event.set()
            thread.join(timeout=30)


def jobs(prefix: str, tenant: str, count: int, seconds: float) -> Iterator[tuple[str, JobSpec]]:
    spec = JobSpec(
        name=prefix, command=["true"], gpus=1, tenant=tenant, labels={SECONDS_LABEL: f"{seconds:g}"}
    )
    for i in range(count):
        yield f"{prefix}-{i}", spec


def gpu_seconds(found: list[Job], start: float, end: float) -> float:
    """GPU-seconds the jobs held between ``start`` and ``end``."""
    total = 0.0
    for job in found:
        if job.started_at is None:
            continue
        held_to = job.finished_at if job.finished_at is not None else end
        total += max(0.0, min(held_to, end) - max(job.started_at, start)) * max(job.spec.gpus, 1)
    return total


def shares(url: str, nodes: int, seconds: float, job_s: float, windows: int) -> dict[str, Any]:
    per_window, gpus = seconds / windows, nodes * 8
    # enough work that neither tenant ever runs dry: each could fill the fleet alone for the run
    count = int(gpus * seconds / job_s * 1.2) + gpus
    with fleet(url, nodes) as (settings, store, tenants):
        tenants.set(Tenant(name="a", weight=1))
        tenants.set(Tenant(name="b", weight=3))
        bulk_create(settings, jobs("a", "a", count, job_s))
        bulk_create(settings, jobs("b", "b", count, job_s))
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        found = {t: store.get_many(f"{t}-{i}" for i in range(count)) for t in ("a", "b")}
    rows = []
    for w in range(windows):
        lo, hi = start + w * per_window, start + (w + 1) * per_window
        a, b = gpu_seconds(found["a"], lo, hi), gpu_seconds(found["b"], lo, hi)
        rows.append((w, a, b, b / (a + b) if a + b else 0.0, (a + b) / (gpus * per_window)))
    settled_a = gpu_seconds(found["a"], start + per_window, end)
    settled_b = gpu_seconds(found["b"], start + per_window, end)
    return {
        "windows": rows,
        "b_share": settled_b / (settled_a + settled_b),
        "per_window_s": per_window,
        "jobs_done": sum(j.state == JobState.SUCCEEDED for f in found.values() for j in f),
    }


def guarantee(url: str, nodes: int, grace_s: float, min_run_s: float) -> dict[str, Any]:
    gpus = nodes * 8
    with fleet(url, nodes) as (settings, store, tenants):
        tenants.set(Tenant(name="a", weight=1, preempt_grace_s=grace_s, min_run_s=min_run_s))
        tenants.set(Tenant(name="b", weight=3, guaranteed_gpus=gpus // 2, preempt_grace_s=grace_s))
        bulk_create(settings, jobs("a", "a", 100, 3600))
        a_ids, b_ids = [f"a-{i}" for i in range(100)], [f"b-{i}" for i in range(20)]
        _until(lambda: sum(j.state == JobState.RUNNING for j in store.get_many(a_ids)) == gpus, 60)
        time.sleep(min_run_s)  # a's jobs may now be preempted
        submitted = time.time()
        bulk_create(settings, jobs("b", "b", 20, 3600))
        _until(lambda: sum(j.state == JobState.RUNNING for j in store.get_many(b_ids)) >= gpus // 2, 120)
        reached = time.time() - submitted
        found = store.get_many(a_ids)
    return {
        "seconds": reached,
        "grace_s": grace_s,
        "guarantee": gpus // 2,
        "preempted": sum(j.infra_requeues > 0 for j in found),
        "retries_spent": sum(j.failures for j in found),
    }


def _until(done: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"not reached within {timeout:g}s")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=240.0, help="length of the shares run")
    parser.add_argument("--job-s", type=float, default=4.0, help="each short job's run time")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--grace-s", type=float, default=5.0, help="tenant a's preempt_grace_s")
    parser.add_argument("--min-run-s", type=float, default=5.0, help="tenant a's min_run_s")
    args = parser.parse_args()
    print(machine_line("fairness"))
    with redis_server() as url:
        s = shares(url, args.nodes, args.seconds, args.job_s, args.windows)
        g = guarantee(url, args.nodes, args.grace_s, args.min_run_s)
    print(
        f"\n## shares: {args.nodes * 8} GPUs, tenants a (weight 1) and b (weight 3), {args.job_s:g} s jobs\n"
    )
    print("| window | a GPU-s | b GPU-s | b's share | fleet busy |")
    print("|---|---|---|---|---|")
    for w, a, b, share, busy in s["windows"]:
        lo = w * s["per_window_s"]
        print(f"| {lo:.0f}-{lo + s['per_window_s']:.0f} s | {a:.0f} | {b:.0f} | {share:.1%} | {busy:.0%} |")
    print(
        f"\nb's share after the first window: **{s['b_share']:.1%}** (weights say 75.0%); "
        f"{s['jobs_done']} jobs done"
    )
    print(f"\n## guarantee: b guaranteed {g['guarantee']} GPUs, a holding all {args.nodes * 8}\n")
    print(
        f"b ran its guarantee **{g['seconds']:.1f} s** after submitting (a's grace {g['grace_s']:g} s); "
        f"{g['preempted']} of a's jobs preempted; retries spent: {g['retries_spent']}"
    )


if __name__ == "__main__":
    main()
