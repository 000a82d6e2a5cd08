"""``fleet run`` forwards its stdin to the job (srun does): through the API, Redis and the node's
agent into the named pipe the attempt reads as its stdin (the process runtime's supervisor gave it
one; a Docker attempt's is mounted into its container)."""

from __future__ import annotations

import contextlib
import io
import signal
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import DockerException

from bench.procs import LASTING_LEASE
from fleet import Client, JobState
from fleet.errors import FleetError, Forbidden, NotFound, SpecError
from tests.conftest import Api, FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration

NODE = "t-stdin"


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def env(procs: FleetProcs, client: Client) -> dict[str, str]:
    procs.one_node(client, NODE, gpus=1)
    return procs.cli_env()


def fleet_run(env: dict[str, str], *args: str, stdin: bytes) -> subprocess.CompletedProcess[str]:
    """``fleet run ARGS`` with ``stdin`` piped in (and closed once written)."""
    argv = [sys.executable, "-m", "fleet", "run", *args]
    return subprocess.run(argv, env=env, input=stdin.decode(), capture_output=True, text=True, timeout=90)


def test_a_piped_stdin_reaches_the_job_which_then_reads_eof(env: dict[str, str], client: Client) -> None:
    ran = fleet_run(env, "--", "sh", "-c", "cat; echo done", stdin=b"a\nb\n")
    assert (ran.returncode, ran.stdout) == (0, "a\nb\ndone\n"), ran.stderr
    (job,) = client.listing()
    assert job.spec.stdin and job.state == JobState.SUCCEEDED


def test_the_job_reads_what_was_piped_and_exits_with_its_code(env: dict[str, str]) -> None:
    ran = fleet_run(env, "--", "sh", "-c", "read n; exit $n", stdin=b"5\n")
    assert ran.returncode == 5, ran.stderr


def test_without_stdin_the_job_reads_eof_at_once(env: dict[str, str], client: Client) -> None:
    """--no-stdin while this side's stdin stays open: the job's stdin is /dev/null."""
    argv = [sys.executable, "-m", "fleet", "run", "--no-stdin", "--", "sh", "-c", "cat; echo done"]
    proc = subprocess.Popen(
        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"never sent\n")
    proc.stdin.flush()
    try:
        assert proc.wait(timeout=90) == 0, proc.stderr.read()
        assert proc.stdout.read() == b"done\n"
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
    # And a stdin of /dev/null is not forwarded unasked either
    argv.remove("--no-stdin")
    quiet = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=90)
    assert (quiet.returncode, quiet.stdout) == (0, b"done\n"), quiet.stderr
    assert [job.spec.stdin for job in client.listing()] == [False, False]


def test_only_the_jobs_submitter_writes_its_stdin(env: dict[str, str], api: Api, client: Client) -> None:
    owner = api.client(api.token_for("ann", "default"))
    handle = owner.submit({"name": "reads", "command": ["sh", "-c", "cat; echo end"], "stdin": True})
    stranger = api.client(api.token_for("eve", "elsewhere"))
    with pytest.raises(NotFound):
        stranger.send_stdin(handle.id, b"from another tenant\n", eof=True)
    colleague = api.client(api.token_for("bob", "default"))
    with pytest.raises(Forbidden, match="only the user who submitted it sends its stdin"):
        colleague.send_stdin(handle.id, b"from bob\n", eof=True)
    owner.send_stdin(handle.id, b"from ann\n", eof=True)
    wait_for(lambda: client.get(handle.id).state.final, timeout=60)
    assert client.get(handle.id).state == JobState.SUCCEEDED
    assert [line.line for line in client.logs(handle.id, 1)] == ["from ann", "end"]
    with pytest.raises(FleetError, match="stdin takes no more input"):
        owner.send_stdin(handle.id, b"late\n")


def test_stdin_is_refused_for_an_array_and_for_a_job_that_reads_none(
    env: dict[str, str], client: Client
) -> None:
    spec = {"name": "sweep", "command": ["cat"], "stdin": True}
    with pytest.raises(SpecError, match="stdin: a job array's tasks read no forwarded input"):
        client.submit_array(spec, "0-1")
    plain = client.submit({"name": "plain", "command": ["sleep", "30"]})
    with pytest.raises(SpecError, match=r"stdin: job .* reads no forwarded input"):
        client.send_stdin(plain.id, b"x")
    client.cancel(plain.id)


def test_an_agent_restarted_mid_input_goes_on_where_it_left(procs: FleetProcs, client: Client) -> None:
    procs.one_node(client, NODE, gpus=1, **LASTING_LEASE)
    job = client.submit(
        {"name": "two", "command": ["sh", "-c", "read a; echo got $a; read b; echo got $b"], "stdin": True}
    )
    client.send_stdin(job.id, b"one\n")
    wait_for(lambda: job.logs() == "got one", what="the first line read", procs=procs)
    pipe = (procs.root / NODE / "attempts" / f"{job.id}.1" / "stdin").lstat()
    assert stat.S_ISFIFO(pipe.st_mode) and stat.S_IMODE(pipe.st_mode) == 0o600  # no other job opens it
    # When the agent is SIGKILLed (the job and its supervisor go on), input comes meanwhile, and it
    # starts again
    procs.procs[NODE].send_signal(signal.SIGKILL)
    procs.procs[NODE].wait()
    client.send_stdin(job.id, b"two\n", eof=True)
    procs.agent(NODE, gpus=1, **LASTING_LEASE)
    # Then the same attempt read the rest, once, and its EOF
    status = job.wait(timeout=60)
    assert (status.state, status.attempt) == (JobState.SUCCEEDED, 1), procs.logs()
    assert job.logs() == "got one\ngot two"


def test_a_requeued_job_goes_on_with_the_input_not_yet_read(
    env: dict[str, str], procs: FleetProcs, client: Client
) -> None:
    """Each byte goes to one attempt: the second reads what the first did not, then EOF."""
    script = 'read a; echo "attempt $FLEET_ATTEMPT read $a"; [ "$FLEET_ATTEMPT" = 2 ] || exit 1; cat'
    job = client.submit({"name": "again", "command": ["sh", "-c", script], "stdin": True, "max_attempts": 2})
    client.send_stdin(job.id, b"first\n")
    wait_for(lambda: client.get(job.id).attempt == 2, what="the second attempt", procs=procs)
    client.send_stdin(job.id, b"second\nrest\n", eof=True)
    status = job.wait(timeout=60)
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert job.logs(attempt=1) == "attempt 1 read first"
    assert job.logs(attempt=2) == "attempt 2 read second\nrest"


def test_a_job_that_reads_no_input_holds_up_no_other_jobs_input(
    env: dict[str, str], procs: FleetProcs, client: Client
) -> None:
    """Its pipe full (64 KiB) and the rest of its input waiting, a job that does not read leaves
    the agent feeding the others; cancelled, it ends as any job."""
    stuck = client.submit({"name": "stuck", "command": ["sleep", "600"], "stdin": True})
    for _ in range(4):
        client.send_stdin(stuck.id, b"x" * (64 << 10))
    wait_for(lambda: client.get(stuck.id).state == JobState.RUNNING, what="the stuck job", procs=procs)
    quick = client.submit({"name": "quick", "command": ["sh", "-c", "wc -c"], "stdin": True})
    client.send_stdin(quick.id, b"y" * 1000, eof=True)
    assert quick.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    assert quick.logs() == "1000"
    client.cancel(stuck.id)
    assert stuck.wait(timeout=60).state == JobState.CANCELLED


def test_a_docker_job_reads_its_piped_stdin_and_eof_across_an_agent_restart(
    docker_procs: FleetProcs, client: Client, shellless: Any
) -> None:
    node = "t-stdin-dock"
    docker_procs.controller()
    docker_procs.agent(node, gpus=1, **LASTING_LEASE)
    docker_procs.wait_nodes(client, 1)
    # A pipe is forwarded unasked to a fleet of Docker nodes: the container reads it, then EOF
    ran = fleet_run(docker_procs.cli_env(), "--", "sh", "-c", "cat; echo done", stdin=b"a\nb\n\nc\n")
    assert (ran.returncode, ran.stdout) == (0, "a\nb\n\nc\ndone\n"), ran.stderr
    script = "id -u; read a; echo got $a; read b; echo got $b; cat"
    job = client.submit({"name": "boxed", "command": ["sh", "-c", script], "stdin": True})
    client.send_stdin(job.id, b"one\n")
    wait_for(lambda: job.logs().endswith("got one"), what="the first line read", procs=docker_procs)
    uid = int(job.logs().splitlines()[0])
    pipe = (docker_procs.root / node / "attempts" / f"{job.id}.1" / "stdin").lstat()
    assert stat.S_ISFIFO(pipe.st_mode) and stat.S_IMODE(pipe.st_mode) == 0o600
    assert uid != 0 and pipe.st_uid == uid  # the job's user alone reads it
    # When the agent is SIGKILLed (the container and the supervisor go on), input comes meanwhile,
    # and it starts again
    docker_procs.procs[node].send_signal(signal.SIGKILL)
    docker_procs.procs[node].wait()
    client.send_stdin(job.id, b"two\nthree\n", eof=True)
    docker_procs.agent(node, gpus=1, **LASTING_LEASE)
    # Then the same container read the rest, once, and its EOF
    status = job.wait(timeout=60)
    assert (status.state, status.attempt) == (JobState.SUCCEEDED, 1), docker_procs.logs()
    assert job.logs().splitlines()[1:] == ["got one", "got two", "three"]
    # And an image without /bin/sh, which would open the pipe, is refused at launch, saying why
    bare = client.submit({"name": "bare", "command": ["cat"], "image": shellless.tags[0], "stdin": True})
    status = bare.wait(timeout=60)
    assert status.state == JobState.FAILED and "has no /bin/sh" in status.reason, status.reason


@pytest.fixture
def shellless(tmp_path: Path) -> Iterator[Any]:
    """An image of one empty file: no shell (and no pull: ``localhost/`` images never are)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))
    api = docker.from_env(timeout=30)
    name = f"localhost/fleet-test/no-shell-{tmp_path.name.lower()}"
    api.api.import_image_from_data(layer.getvalue(), repository=name, tag="latest")
    image = api.images.get(f"{name}:latest")
    yield image
    with contextlib.suppress(DockerException):
        api.images.remove(image.id, force=True)
    api.close()
