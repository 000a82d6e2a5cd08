"""Submitting while Redis or the bus misbehaves: the job exists once, and the caller is told so."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import fleet.api.commands
from bench.procs import DirectClient, FleetProcs
from fleet import JobSpec, JobState
from fleet.config import load_settings
from fleet.errors import StoreUnavailable
from fleet.ops.local import free_port
from tests.integration.test_control_plane import _pings
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of our own (the test freezes it), with only DBs 0 (state) and 1 (bus)."""
    port = free_port()
    argv = [
        shutil.which("redis-server") or "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
        "--save",
        "",
        "--appendonly",
        "no",
        "--databases",
        "2",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: _pings(url), timeout=10, what="redis up")
    yield url, proc
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    proc.wait()


def spec() -> JobSpec:
    return JobSpec.parse({"name": "once", "command": [sys.executable, "-c", "print('ran')"]})


def test_a_submit_whose_first_try_times_out_after_the_create_exists_once(
    small_redis: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, server = small_redis
    client = DirectClient(url)
    try:
        earlier = client.submit(spec())  # connected, with the submit script loaded in Redis
        # Given Redis frozen (SIGSTOP) for longer than the client's 5 s socket timeout, so the first
        # create is sent, times out, and runs once Redis resumes
        server.send_signal(signal.SIGSTOP)
        threading.Timer(5.5, server.send_signal, args=(signal.SIGCONT,)).start()
        # When the user submits, and submits again if told it failed (what a script does on error)
        try:
            handle = client.submit(spec())
        except StoreUnavailable:
            handle = client.submit(spec())
        # Then exactly one job exists for that submit, the one it returned
        assert [j.id for j in client.jobs()] == [handle.id, earlier.id]
        assert handle.status().state == JobState.QUEUED
    finally:
        server.send_signal(signal.SIGCONT)
        client.close()


def test_a_submit_whose_notify_fails_succeeds_and_the_job_still_runs(
    small_redis: tuple[str, subprocess.Popen[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, _server = small_redis
    procs = FleetProcs(url, tmp_path, "process")
    # Given a client whose bus is broken (its bus DB does not exist on this Redis) next to a working fleet
    client = DirectClient(settings=load_settings(redis_url=url, bus_db=5))
    try:
        procs.one_node(client, "t-a", gpus=1)
        # When a job is submitted
        with caplog.at_level(logging.WARNING, logger="fleet.api.backend"):
            handle = client.submit(spec())
        # Then the submit succeeds with a warning, the job exists once, and the periodic pass runs it
        assert [r.getMessage().split()[0] for r in caplog.records] == ["submit_notify_failed"]
        assert f"job={handle.id}" in caplog.records[0].getMessage()
        assert handle.wait(timeout=30).state == JobState.SUCCEEDED, procs.logs()
        assert [j.id for j in client.jobs()] == [handle.id]
    finally:
        procs.stop()
        client.close()


@pytest.fixture
def runtime() -> str:
    return "process"


def test_every_submitted_job_is_queued_when_a_generated_id_repeats(
    procs: FleetProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a fleet whose only GPU is held by a long-running job (the ids are drawn by the backend,
    # in this process: no API in between, so the test can rig the draw)
    client = DirectClient(procs.redis_url)
    procs.one_node(client, "t-busy", gpus=1)
    running = client.submit({"name": "long", "command": ["sleep", "600"], "gpus": 1})
    wait_for(lambda: running.status().state == JobState.RUNNING, timeout=30, what="long job running")
    # And a generator of job ids that repeats itself once, as 32 random bits did about once in a
    # 10,000-job submit loop (and every other time in a 50,000-job one)
    draws, generated = iter(["q-twice", "q-twice"]), fleet.api.commands.new_id
    monkeypatch.setattr(fleet.api.commands, "new_id", lambda name: next(draws, None) or generated(name))

    # When 2,000 jobs are submitted one after another
    spec = JobSpec.parse({"name": "q", "command": ["true"], "gpus": 1})
    handles = [client.submit(spec) for _ in range(2000)]

    # Then each submit returned a job of its own, and every one of them waits in the queue
    assert len({h.id for h in handles}) == 2000 and handles[0].id == "q-twice"
    queued = client.jobs(state="QUEUED", limit=5000)
    assert sorted(j.id for j in queued) == sorted(h.id for h in handles)
    assert client.get(running.id).state == JobState.RUNNING
