"""Job output as `fleet logs` shows it, on both runtimes: complete, in order, never twice.

One thread per agent ships every attempt's output in rounds (``fleet/agent/logship.py``); these
tests check what a user reads back, under many attempts at once, an abrupt end and an agent restart.
"""

from __future__ import annotations

import signal
import time

import pytest
from redis import Redis

from bench.procs import LASTING_LEASE
from fleet import Client, JobSpec, JobState
from tests.conftest import FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration


def sh(script: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": "t", "command": ["sh", "-c", script], **fields})


def counting(lines: int, pause_every: int, pause_s: float) -> JobSpec:
    """A job printing ``<job id> line <i>`` for i < ``lines``, pausing now and then."""
    script = (
        f'i=0; while [ $i -lt {lines} ]; do echo "$FLEET_JOB_ID line $i"; i=$((i+1)); '
        f"if [ $((i % {pause_every})) -eq 0 ]; then sleep {pause_s}; fi; done"
    )
    return sh(script, gpus=1)


def test_many_jobs_at_once_each_get_all_their_output_in_order(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    # Given a node with 8 GPUs
    procs.one_node(client, "t-logs", gpus=8)
    # When 8 jobs print 300 lines each at the same time, in bursts spread over several rounds
    handles = [client.submit(counting(300, 50, 0.2)) for _ in range(8)]
    statuses = [h.wait(timeout=120) for h in handles]
    # Then every job's output is all there, in order, each line once
    assert [s.state for s in statuses] == [JobState.SUCCEEDED] * 8, procs.logs()
    for h in handles:
        assert h.logs().splitlines() == [f"{h.id} line {i}" for i in range(300)]


def test_a_last_line_without_newline_of_a_job_that_exits_at_once_is_kept(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    procs.one_node(client, "t-logs", gpus=2)
    # When jobs print a last line without its newline and exit at once, one of them failing
    ok = client.submit(sh("echo first; printf 'the last line, no newline'"))
    failed = client.submit(sh("echo first; printf 'goodbye'; exit 3", max_attempts=1))
    # Then that last line is in their logs too
    assert ok.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    assert failed.wait(timeout=60).state == JobState.FAILED, procs.logs()
    assert ok.logs() == "first\nthe last line, no newline"
    assert failed.logs() == "first\ngoodbye"


def test_an_agent_restart_mid_job_ships_no_line_twice_and_loses_none(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    procs.one_node(client, "t-logs", gpus=1, **LASTING_LEASE)
    job = client.submit(counting(120, 1, 0.04))
    wait_for(lambda: len(job.logs().splitlines()) >= 20, what="20 lines shipped")
    # When the agent is SIGKILLed mid-job (the job keeps running) and started again
    procs.procs["t-logs"].send_signal(signal.SIGKILL)
    procs.procs["t-logs"].wait()
    procs.agent("t-logs", gpus=1, **LASTING_LEASE)
    status = job.wait(timeout=120)
    # Then the same attempt finished and its output reads as if nothing happened
    assert status.state == JobState.SUCCEEDED and status.attempt == 1, procs.logs()
    assert job.logs().splitlines() == [f"{job.id} line {i}" for i in range(120)]
    assert "attempt_reattached" in (procs.root / "t-logs.log").read_text()


def test_output_of_a_job_that_ended_while_its_agent_was_down_is_shipped_whole(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    procs.controller()
    lease = {"FLEET_AGENT__NODE_LEASE_TTL_S": "10"}  # the node stays up while its agent is away
    procs.agent("t-logs", gpus=1, **lease)
    procs.wait_nodes(client, 1)
    job = client.submit(sh("echo before; sleep 1; echo after; printf 'the end'", gpus=1))
    wait_for(lambda: job.logs() == "before", what="the first line shipped")
    # When the agent is SIGKILLed, the job ends meanwhile, and the agent starts again
    procs.procs["t-logs"].send_signal(signal.SIGKILL)
    procs.procs["t-logs"].wait()
    time.sleep(2)
    procs.agent("t-logs", gpus=1, **lease)
    # Then the job succeeded on its first attempt with all of its output
    status = job.wait(timeout=60)
    assert status.state == JobState.SUCCEEDED and status.attempt == 1, procs.logs()
    assert job.logs() == "before\nafter\nthe end"


def test_one_job_cannot_fill_redis_with_its_output(
    procs: FleetProcs, client: Client, redis_url: str, runtime: str
) -> None:
    # Given a fleet keeping about 1 MiB of each attempt's output, lines cut at 16 KiB (the default)
    procs.env["FLEET_LOG_MAX_BYTES"] = str(1 << 20)
    procs.one_node(client, "t-flood", gpus=1)
    # When a job prints 100 lines of 1 MiB, then 300 lines of 10 KiB, then its last line
    script = (
        "i=0; while [ $i -lt 100 ]; do head -c 1048576 /dev/zero | tr '\\0' x; echo; i=$((i+1)); done; "
        "i=0; while [ $i -lt 300 ]; do printf '%dy' $i; head -c 10000 /dev/zero | tr '\\0' y; echo; "
        "i=$((i+1)); done; echo the end"
    )
    job = client.submit(sh(script))
    assert job.wait(timeout=120).state == JobState.SUCCEEDED, procs.logs()
    # Then Redis holds about a megabyte of it, not 100 MB: its last lines, none over 16 KiB
    with Redis.from_url(redis_url) as redis:
        stream = redis.memory_usage(f"fleet:job:{job.id}:logs:1")
    assert stream is not None and stream < 4 << 20
    lines = job.logs().splitlines()
    assert lines[-1] == "the end" and lines[-2].startswith("299y")
    assert 50 < len(lines) < 300
    assert max(len(line.encode()) for line in lines) <= (16 << 10) + 100
    if runtime == "process":  # Docker's log driver hands over a long line in 16 KiB pieces already
        cut = f" … [{(1 << 20) - (16 << 10)} more bytes cut: log_max_line_bytes]"
        assert all(line.endswith(cut) for line in lines if line.startswith("x"))
