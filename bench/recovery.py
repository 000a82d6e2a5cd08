"""Recovery times (issue: dependability), real processes and signals, process runtime.

- node death -> all of its jobs running again elsewhere, default settings and a 3 s lease;
- a multi-node job's member node death -> the whole job running again on the nodes left;
- container crash -> next attempt started (backoff + dispatch);
- agent restart -> reattached, with zero requeues.

Run: ``python -m bench.recovery`` (``make bench`` runs it after the dispatch benchmark).
"""

from __future__ import annotations

import signal
import statistics
import sys
import time

from bench.dispatch import machine_line
from bench.procs import DirectClient, FleetProcs, job_root
from fleet import JobSpec, JobState

DEFAULTS = {
    "FLEET_RETRY_BACKOFF_S": "5",
    "FLEET_CONTROLLER__SCHEDULE_INTERVAL_S": "2",
    "FLEET_CONTROLLER__LEADER_LEASE_S": "5",
    "FLEET_AGENT__HEARTBEAT_INTERVAL_S": "1",
    "FLEET_AGENT__NODE_LEASE_TTL_S": "10",
    "FLEET_AGENT__RECONCILE_INTERVAL_S": "2",
}
AGGRESSIVE = {
    **DEFAULTS,
    "FLEET_AGENT__HEARTBEAT_INTERVAL_S": "0.5",
    "FLEET_AGENT__NODE_LEASE_TTL_S": "3",
    "FLEET_AGENT__FENCE_MARGIN_S": "1",
    "FLEET_CONTROLLER__SCHEDULE_INTERVAL_S": "0.5",
}


def sleeper(seconds: float, **fields: object) -> JobSpec:
    command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    return JobSpec.parse({"name": "bench", "command": command, "gpus": 1, **fields})


def until(condition: object, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError


def fleet(redis_url: str, env: dict[str, str]) -> tuple[FleetProcs, DirectClient]:
    procs = FleetProcs(redis_url, job_root("fleet-bench-"), "process")
    procs.env.update(env)
    client = DirectClient(redis_url)
    client._jobs.redis.flushall()
    return procs, client


def node_death(redis_url: str, env: dict[str, str]) -> float:
    procs, client = fleet(redis_url, env)
    try:
        procs.controller()
        procs.agent("a", gpus=2)
        procs.wait_nodes(client, 1)
        jobs = [client.submit(sleeper(600)) for _ in range(2)]
        until(lambda: all(j.status().state == JobState.RUNNING for j in jobs))
        procs.agent("b", gpus=2)
        procs.wait_nodes(client, 2)
        killed = time.monotonic()
        procs.kill_node("a")
        done = until(
            lambda: all((j.status().node, j.status().state) == ("b", JobState.RUNNING) for j in jobs)
        )
        return done - killed
    finally:
        procs.stop()
        client.close()


def gang_node_death(redis_url: str, env: dict[str, str]) -> float:
    """A 2-node job (2 x 2 GPUs) on three nodes: rank 1's node loses power -> the job RUNNING again,
    whole, on the two nodes left."""
    procs, client = fleet(redis_url, {**env, "FLEET_AGENT__ADDRESS": "127.0.0.1"})
    try:
        procs.controller()
        for name in ("a", "b", "c"):
            procs.agent(name, gpus=2)
        procs.wait_nodes(client, 3)
        job = client.submit(sleeper(600, gpus=4, nodes=2))
        until(lambda: job.status().state == JobState.RUNNING)
        killed = time.monotonic()
        procs.kill_node(job.status().members[1].node)
        done = until(lambda: (job.status().attempt, job.status().state) == (2, JobState.RUNNING))
        return done - killed
    finally:
        procs.stop()
        client.close()


def crash_to_next_attempt(redis_url: str) -> float:
    procs, client = fleet(redis_url, DEFAULTS)
    try:
        procs.controller()
        procs.agent("a", gpus=1)
        procs.wait_nodes(client, 1)
        command = [
            sys.executable,
            "-c",
            "import os, sys, time; sys.exit(1 if os.environ['FLEET_ATTEMPT'] == '1' else 0)",
        ]
        job = client.submit(JobSpec(name="crash", command=command, gpus=1))
        job.wait(timeout=60)
        history = job.history()
        exited = next(e.at for e in history if e.state == "QUEUED" and e.attempt == 1)
        started = next(e.at for e in history if e.state == "RUNNING" and e.attempt == 2)
        return started - exited
    finally:
        procs.stop()
        client.close()


def agent_restart(redis_url: str) -> tuple[float, int]:
    procs, client = fleet(redis_url, DEFAULTS)
    try:
        procs.controller()
        procs.agent("a", gpus=1)
        procs.wait_nodes(client, 1)
        job = client.submit(sleeper(600))
        until(lambda: job.status().state == JobState.RUNNING)
        procs.procs["a"].send_signal(signal.SIGKILL)
        procs.procs["a"].wait()
        restarted = time.monotonic()
        procs.agent("a", gpus=1)
        log = procs.root / "a.log"
        done = until(lambda: log.read_text().count("attempt_reattached") >= 1)
        return done - restarted, job.status().infra_requeues
    finally:
        procs.stop()
        client.close()


def main() -> None:
    from bench.dispatch import redis_server

    with redis_server() as url:
        print(machine_line("recovery"))
        print("| what | settings | runs | median s | max s | target |")
        print("|---|---|---|---|---|---|")
        for name, env, target in (
            ("defaults (1 s heartbeat, 10 s lease)", DEFAULTS, 15.0),
            ("aggressive (0.5 s heartbeat, 3 s lease)", AGGRESSIVE, 5.0),
        ):
            times = [node_death(url, env) for _ in range(3)]
            print(
                f"| node death -> 2 jobs running elsewhere | {name} | 3 | {statistics.median(times):.1f} "
                f"| {max(times):.1f} | <= {target:g} s |",
                flush=True,
            )
            times = [gang_node_death(url, env) for _ in range(3)]
            print(
                f"| a 2-node job's member node death -> running again, whole | {name} | 3 "
                f"| {statistics.median(times):.1f} | {max(times):.1f} | <= {target:g} s |",
                flush=True,
            )
        times = [crash_to_next_attempt(url) for _ in range(3)]
        print(
            f"| container crash -> next attempt running | backoff 5 s | 3 | {statistics.median(times):.2f} "
            f"| {max(times):.2f} | <= 6 s |",
            flush=True,
        )
        results = [agent_restart(url) for _ in range(3)]
        times = [r[0] for r in results]
        requeues = sum(r[1] for r in results)
        print(
            f"| agent restart -> reattached (requeues: {requeues}) | defaults | 3 "
            f"| {statistics.median(times):.2f} | {max(times):.2f} | <= 2 s, 0 requeues |",
            flush=True,
        )


if __name__ == "__main__":
    main()
