"""Nothing a user sends becomes a path, a key or a privilege; jobs run unprivileged; credentials
reach Redis intact and never through a URL built by hand.

Real agents and controllers as processes, real Redis, the real Docker daemon where it says so.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.procs import DirectClient, FleetProcs
from fleet import Client, JobSpec, JobState
from fleet.errors import SpecError
from fleet.keys import Keys
from fleet.ops.local import free_port
from fleet.state import JobStore, connect
from tests.conftest import need

pytestmark = pytest.mark.integration
#: the default: each tenant's jobs run as a uid of its own (agent.job_uid_range), never root
UNPRIVILEGED = {"FLEET_AGENT__JOB_USER": "", "FLEET_AGENT__ALLOW_ROOT_JOBS": "false"}
FIRST_UID = 1_000_000_000  # the first tenant's, from the default range


def start(procs: FleetProcs, client: Client, node: str = "t-sec", **env: str) -> None:
    procs.one_node(client, node, gpus=1, **{**UNPRIVILEGED, **env})


def test_a_job_id_that_is_a_path_is_refused_at_submit(procs: FleetProcs, client: Client) -> None:
    # When a user submits with ids that would escape the checkpoint root or collide with other keys
    for bad in ("../victim", "/", "a:b", "..", "x" * 200):
        with pytest.raises(SpecError, match=r"job id .* is invalid"):
            client.submit(JobSpec(name="x", command=["true"]), job_id=bad)
    cli = subprocess.run(
        [sys.executable, "-m", "fleet", "submit", "--id", "../victim", "--", "true"],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Then nothing was queued, and the CLI says why with a usage error
    assert cli.returncode == 2 and "job id '../victim' is invalid" in cli.stderr
    assert client.jobs() == []


def test_an_agent_never_turns_a_crafted_id_into_a_path(
    procs: FleetProcs, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a record whose id escapes the checkpoint root, written around the store's own check
    # (as an older fleet, or anyone with the Redis password, could have written it)
    start(procs, client)
    victim = procs.root / "victim"
    victim.mkdir(mode=0o700)
    store = JobStore(connect(procs.settings()), Keys())
    monkeypatch.setattr("fleet.state.jobs.check_job_id", lambda job_id: job_id)
    store.create("../victim", JobSpec(name="x", command=["true"]), time.time())
    # When it is scheduled, the agent refuses to build a path from it: the job fails with the reason
    deadline = time.monotonic() + 30
    while (job := store.get_many(["../victim"])[0]).state != JobState.FAILED and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.state == JobState.FAILED and "job id '../victim' is invalid" in job.reason, procs.logs()
    # And the directory outside the checkpoint root was not touched
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700
    store.redis.close()


def test_jobs_run_unprivileged_with_a_private_checkpoint_dir(
    procs: FleetProcs, client: Client, runtime: str
) -> None:
    # Given a node with per-tenant uids (the default) and a job that reports who it is and what it may do
    start(procs, client)
    pids = "cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max 2>/dev/null; true"
    script = f"id -u; id -g; grep CapEff /proc/self/status; {pids}"
    job = client.submit(JobSpec(name="whoami", command=["sh", "-c", script]))
    status = job.wait(timeout=60)
    lines = job.logs().split("\n")
    # Then it ran as its tenant's uid (the first tenant: the range's first), with no capability, and
    # its checkpoint dir is its own, 0700
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert lines[:2] == [str(FIRST_UID), str(FIRST_UID)], lines
    assert lines[2].split() == ["CapEff:", "0000000000000000"]
    ckpt = procs.root / "checkpoints" / job.id
    assert (ckpt.stat().st_uid, ckpt.stat().st_gid, stat.S_IMODE(ckpt.stat().st_mode)) == (
        FIRST_UID,
        FIRST_UID,
        0o700,
    )
    if runtime == "docker":
        assert lines[3] == "4096"  # the default pids limit


def test_a_job_asking_for_root_fails_unless_the_operator_allows_it(procs: FleetProcs, client: Client) -> None:
    # Given a tenant an admin allowed uid 0 (with a group of its own: gid 0 is never allowed)
    start(procs, client)
    client.set_tenant("default", allowed_users=["0:100"])
    job = client.submit(JobSpec(name="root", command=["id", "-u"], user="0:100"))
    status = job.wait(timeout=60)
    # Then a node that does not allow root jobs fails it, saying which setting would
    assert status.state == JobState.FAILED and "allow_root_jobs" in status.reason
    assert status.attempt == 1  # not retried: it can never work on this node


@pytest.mark.docker
def test_a_local_image_is_never_pulled(procs: FleetProcs, client: Client, runtime: str) -> None:
    if runtime != "docker":
        pytest.skip("docker only: the process runtime has no images")
    # Given a node that pulls missing images
    start(procs, client, FLEET_AGENT__DOCKER_PULL="missing")
    # When a job names a localhost/ image that was never built on the node
    job = client.submit(JobSpec(name="img", image="localhost/fleet/not-built:latest", command=["true"]))
    status = job.wait(timeout=60)
    # Then it fails at once with the reason, without trying any registry
    assert status.state == JobState.FAILED and status.attempt == 1
    assert "never pulled" in status.reason and "not found on node t-sec" in status.reason
    assert "image_pull" not in (procs.root / "t-sec.log").read_text()


class PasswordRedis:
    """A redis-server whose password holds '@', '/' and '#' (a hand-built URL dials the wrong host)."""

    PASSWORD = "p@ss/w#rd:x"

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="fleet-test-pw-")
        self.port = free_port()
        binary = shutil.which("redis-server") or "redis-server"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                self.PASSWORD,
            ],
            stdout=subprocess.DEVNULL,
        )
        probe = redis.Redis(port=self.port, password=self.PASSWORD)
        for _ in range(100):
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        probe.close()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def pw_redis() -> Iterator[PasswordRedis]:
    need(shutil.which("redis-server") is not None, "redis-server not installed")
    server = PasswordRedis()
    yield server
    server.close()


def test_a_password_with_url_characters_reaches_redis_intact(
    pw_redis: PasswordRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a fleet whose Redis password holds '@', '/', '#' and ':', given apart from the URL
    url = f"redis://127.0.0.1:{pw_redis.port}/0"
    procs = FleetProcs(url, tmp_path, "process")
    procs.env["FLEET_REDIS_PASSWORD"] = pw_redis.PASSWORD
    monkeypatch.setenv("FLEET_REDIS_PASSWORD", pw_redis.PASSWORD)
    try:
        client = DirectClient(url)
        start(procs, client)
        # When a job runs through the controller, the bus and the agent
        job = client.submit(JobSpec(name="pw", command=["true"]))
        # Then it succeeds, and no service log shows the password
        assert job.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
        assert pw_redis.PASSWORD not in procs.logs()
        client.close()
    finally:
        procs.stop()
