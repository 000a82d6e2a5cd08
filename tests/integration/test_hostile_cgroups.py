"""Jobs that try to outlive or outgrow their attempt: each process-runtime attempt runs in a cgroup of
its own (memory, CPU and pids limits; killed as a whole), and Docker jobs that name no limits get the
node's defaults. The process-runtime tests need writable cgroups (an agent that is root)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import docker
import pytest

from fleet import Client, JobSpec, JobState
from fleet.agent.cgroups import detect
from tests.conftest import FleetProcs
from tests.integration.test_supervisor_lifetime import running
from tests.support import wait_for

pytestmark = pytest.mark.integration
MiB = 1 << 20


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def cgroups() -> None:
    layout = detect()
    if layout.kind == "none":
        pytest.skip(f"the process runtime contains jobs in cgroups, and here there are none: {layout.why}")


def shared(tmp_path: Path) -> Path:
    """A directory the job's user may write its pids to."""
    folder = tmp_path / "pids"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def escape(folder: Path) -> str:
    """A child moved to a session of its own (out of the job's process group), its pid in ``folder``."""
    pid = f"echo $$ > {folder}/child.tmp; mv {folder}/child.tmp {folder}/child"
    return f"setsid sh -c '{pid}; exec sleep 300'"


@contextlib.contextmanager
def reaped(folder: Path):  # type: ignore[no-untyped-def]
    """Kill the escaped child whatever the test found (on a runtime that let it escape)."""
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int((folder / "child").read_text()), signal.SIGKILL)


def test_a_cancelled_job_takes_the_child_it_moved_to_a_session_of_its_own(
    cgroups: None, procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    folder = shared(tmp_path)
    procs.one_node(client, "t-hc", gpus=1)
    with reaped(folder):
        # Given a running job whose child left the job's process group and session
        job = client.submit(JobSpec(name="escape", command=["sh", "-c", f"{escape(folder)} & wait"]))
        wait_for(lambda: (folder / "child").exists(), 30, "the child started", procs)
        child = int((folder / "child").read_text())
        assert running(child) and os.getsid(child) == child
        # When the job is cancelled
        job.cancel()
        # Then it ends CANCELLED and its escaped child is gone too
        assert job.wait(timeout=60).state == JobState.CANCELLED, procs.logs()
        wait_for(lambda: not running(child), 15, "the escaped child killed", procs)


def test_a_killed_supervisor_leaves_nothing_of_a_job_running_when_its_next_attempt_starts(
    cgroups: None, procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    folder = shared(tmp_path)
    # attempt 1 leaves a child in a session of its own; attempt 2 fails if that child still runs
    script = (
        f'if [ "$FLEET_ATTEMPT" = 1 ]; then {escape(folder)} & wait; exit 0; fi\n'
        f"p=$(cat {folder}/child)\n"
        "if [ -e /proc/$p ] && ! grep -q '^State:.Z' /proc/$p/status; then\n"
        '  echo "child $p runs"; exit 3\n'
        "fi\n"
        "echo clean"
    )
    procs.one_node(client, "t-hs", gpus=1)
    with reaped(folder):
        # Given attempt 1 of a job running, with its escaped child
        job = client.submit(JobSpec(name="outlive", command=["sh", "-c", script], max_attempts=1))
        wait_for(lambda: (folder / "child").exists(), 30, "the child started", procs)
        child = int((folder / "child").read_text())
        assert running(child)
        # When the node's supervisor is SIGKILLed (its parent-death signal reaches the leader only)
        os.kill(int((procs.root / "t-hs" / "supervisor.pid").read_text()), signal.SIGKILL)
        # Then the agent finds the attempt lost and starts attempt 2, which finds no child of attempt 1
        status = job.wait(timeout=60)
        assert status.state == JobState.SUCCEEDED and status.attempt == 2, (job.logs(), procs.logs())
        assert job.logs() == "clean" and not running(child)


def test_a_job_over_its_memory_is_oom_killed_and_told_so(
    cgroups: None, procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    procs.one_node(client, "t-hm", gpus=1)
    # Given a job limited to 64 MiB whose child, in a session of its own, fills 512 MiB
    hog = "setsid python3 -c 'b = bytearray(512 << 20); print(\"not killed\")'"
    job = client.submit(JobSpec(name="hog", command=["sh", "-c", hog], memory="64m", max_attempts=1))
    # Then the kernel kills it at the limit, and the job says so
    status = job.wait(timeout=60)
    assert status.state == JobState.FAILED, procs.logs()
    assert status.reason.startswith("OOMKilled (memory limit 64 MiB)"), status.reason
    assert "not killed" not in job.logs()


def test_a_fork_bomb_stops_at_the_pids_limit_and_the_node_keeps_serving(
    cgroups: None, procs: FleetProcs, client: Client
) -> None:
    procs.one_node(client, "t-hf", gpus=1, FLEET_AGENT__PIDS_LIMIT="32")
    # Given a job that forks 200 children (each sleeping) on a node whose jobs may hold 32 processes
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(300)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "print('forked', n, flush=True)\n"
        "time.sleep(300)\n"
    )
    job = client.submit(JobSpec(name="bomb", command=["python3", "-c", bomb]))
    wait_for(lambda: job.logs().startswith("forked"), 60, "the bomb done forking", procs)
    # Then it got fewer than 32 processes, itself included
    forked = int(job.logs().split()[1])
    assert forked < 32, job.logs()
    # And the node still runs other jobs meanwhile
    other = client.submit(JobSpec(name="other", command=["sh", "-c", "echo ok"]))
    assert other.wait(timeout=60).state == JobState.SUCCEEDED and other.logs() == "ok", procs.logs()
    assert client.get(job.id).state == JobState.RUNNING
    job.cancel()
    assert job.wait(timeout=60).state == JobState.CANCELLED


def test_a_docker_job_that_names_no_limits_gets_the_nodes_defaults(
    docker_procs: FleetProcs, client: Client
) -> None:
    docker_procs.controller()
    docker_procs.agent("t-hd", gpus=1, FLEET_AGENT__DEFAULT_MEMORY="256m")
    docker_procs.wait_nodes(client, 1)
    # Given a CPU-only job that names no memory, CPUs or shm size
    job = client.submit(JobSpec(name="plain", command=["sleep", "60"]))
    wait_for(lambda: client.get(job.id).state == JobState.RUNNING, 60, "the job running", docker_procs)
    # Then its container has the node's default memory (no swap), one CPU, and a 1 GiB /dev/shm
    api = docker.from_env(timeout=10)
    try:
        host = api.containers.get(f"fleet-{job.id}-1").attrs["HostConfig"]
    finally:
        api.close()
    assert (host["Memory"], host["MemorySwap"]) == (256 * MiB, 256 * MiB)
    assert host["NanoCpus"] == 1_000_000_000 and host["ShmSize"] == 1024 * MiB
    job.cancel()
    assert job.wait(timeout=60).state == JobState.CANCELLED


def test_a_cancelled_docker_job_leaves_no_process_of_its_container(
    docker_procs: FleetProcs, client: Client
) -> None:
    docker_procs.controller()
    docker_procs.agent("t-hd", gpus=1)
    docker_procs.wait_nodes(client, 1)
    # Given a running container job whose child moved to a session of its own
    job = client.submit(JobSpec(name="escape", command=["sh", "-c", "setsid sleep 300 & sleep 300"]))
    api = docker.from_env(timeout=10)
    try:
        name = f"fleet-{job.id}-1"

        def host_pids() -> list[int]:
            try:
                top = api.containers.get(name).top(ps_args="-eo pid")
            except docker.errors.NotFound:
                return []
            except docker.errors.APIError as e:
                if e.status_code == 409:  # created, not started yet
                    return []
                raise
            return [int(row[0]) for row in top["Processes"]]

        # (init, the escaped sleep, and the shell's, which the shell became)
        wait_for(lambda: len(host_pids()) >= 3, 60, "the container's processes", docker_procs)
        pids = host_pids()
        # When the job is cancelled
        job.cancel()
        # Then it ends CANCELLED and none of its processes runs on the host, the escaped one included
        assert job.wait(timeout=60).state == JobState.CANCELLED, docker_procs.logs()
        wait_for(lambda: not any(running(pid) for pid in pids), 15, "every process gone", docker_procs)
    finally:
        api.close()
