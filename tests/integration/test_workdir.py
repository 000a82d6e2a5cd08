"""Shipping code with a job: `fleet submit --workdir DIR -- python3 train.py` from a directory that
is not in any image, uploaded once, unpacked safely, the job's working directory."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet import Client, JobSpec, JobState, SpecError
from fleet.client.workdir import pack
from fleet.models import NodeState
from fleet.workdir import digest_of, unpack
from tests.conftest import Api, FleetProcs, need_torch

pytestmark = pytest.mark.integration


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("import pkg.model, os\nprint(pkg.model.NAME, os.listdir('.'))\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("NAME = 'tiny-model'\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 1024)
    (root / "notes.log").write_text("local notes\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / ".fleetignore").write_text("data/\n")
    return root


@pytest.fixture
def runtime() -> str:
    return "process"


def test_a_shipped_directory_is_the_jobs_working_directory(
    procs: FleetProcs, client: Client, project: Path, redis: redis.Redis
) -> None:
    procs.one_node(client, "t-w", gpus=1)
    # When a user submits from their project directory, twice
    argv = [
        sys.executable,
        "-m",
        "fleet",
        "submit",
        "--wait",
        "--workdir",
        ".",
        "--",
        sys.executable,
        "train.py",
    ]
    first = subprocess.run(
        argv, cwd=project, env=procs.cli_env(), capture_output=True, text=True, timeout=120
    )
    second = subprocess.run(
        argv, cwd=project, env=procs.cli_env(), capture_output=True, text=True, timeout=120
    )
    # Then each job ran the project's own code, without what the ignore files and .git leave out
    assert first.returncode == 0 and second.returncode == 0, first.stderr + procs.logs()
    job_id = first.stdout.split()[0]
    assert client.get(job_id).spec.workdir == digest_of(pack(project))
    assert client.get(job_id).spec.workdir.startswith("sha256:")
    output = client.logs(job_id)[0].line
    assert output.startswith("tiny-model") and "data" not in output and "notes.log" not in output
    assert "'.git'" not in output and "'train.py'" in output and "'pkg'" in output
    # And the unchanged directory was stored once (one blob), kept for the retention
    blobs = list(redis.scan_iter("fleet:blob:*"))
    assert len(blobs) == 1 and redis.ttl(blobs[0]) > 6 * 86400


def test_a_link_out_of_the_project_is_refused_at_submit_and_no_job_is_queued(
    procs: FleetProcs, client: Client, project: Path
) -> None:
    # Given a project whose data is a link to a dataset outside it (common on a workstation)
    (project / "datasets").symlink_to("/srv/datasets/imagenet")
    argv = [sys.executable, "-m", "fleet", "submit", "--workdir", ".", "--", sys.executable, "train.py"]
    # When the user submits it
    refused = subprocess.run(
        argv, cwd=project, env=procs.cli_env(), capture_output=True, text=True, timeout=60
    )
    # Then the submit fails as bad input, naming the link and the two ways out, and nothing is queued
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "'datasets' is a link to an absolute path ('/srv/datasets/imagenet')" in refused.stderr
    assert "a line 'datasets' in" in refused.stderr and "mount" in refused.stderr
    assert client.jobs() == []
    # And once the link is left out, the same command queues the job
    (project / ".fleetignore").write_text("data/\ndatasets\n")
    queued = subprocess.run(
        argv, cwd=project, env=procs.cli_env(), capture_output=True, text=True, timeout=60
    )
    assert queued.returncode == 0, queued.stderr
    assert [j.id for j in client.jobs()] == [queued.stdout.split()[0]]


def test_a_spec_naming_a_directory_never_uploaded_is_refused(client: Client) -> None:
    with pytest.raises(SpecError, match="not uploaded"):
        client.submit(JobSpec(name="x", command=["true"], workdir="sha256:" + "0" * 64))
    with pytest.raises(SpecError, match="not a directory"):
        client.submit(JobSpec(name="x", command=["true"], workdir="/no/such/dir"))


def test_an_archive_that_escapes_its_directory_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    data = buffer.getvalue()
    with pytest.raises(SpecError, match="cannot be unpacked safely"):
        unpack(data, digest_of(data), tmp_path / "workdirs")
    assert not (tmp_path / "escaped").exists()
    with pytest.raises(SpecError, match="do not match their digest"):
        unpack(data, "sha256:" + "1" * 64, tmp_path / "workdirs")


def test_a_directory_too_large_to_ship_is_refused_naming_the_fix(project: Path) -> None:
    with pytest.raises(SpecError, match=r"more than 0 MiB to ship .*\.fleetignore"):
        pack(project, max_bytes=10)


def test_in_a_container_the_shipped_directory_is_a_private_writable_copy(
    docker_procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given a project whose script reads a file, then writes over it and beside it
    project = tmp_path / "shell-project"
    project.mkdir()
    (project / "run.sh").write_text(
        "cat model.txt; pwd; ls here 2>/dev/null; echo changed > model.txt && touch here && echo writable\n"
    )
    (project / "model.txt").write_text("tiny-model\n")
    docker_procs.controller()
    docker_procs.agent("t-wd", gpus=1)
    docker_procs.wait_nodes(client, 1)
    # When two jobs ship it, one after the other
    for _ in range(2):
        job = client.submit(JobSpec(name="sh", command=["sh", "run.sh"], workdir=str(project)))
        status = job.wait(timeout=120)
        assert status.state == JobState.SUCCEEDED, docker_procs.logs()
        # Then each starts in /fleet/workdir with the shipped files and may write there, and what
        # the first wrote is not what the second finds: each attempt has a copy of its own
        assert job.logs() == "tiny-model\n/fleet/workdir\nwritable"
    # and the node's unpacked copy, which later jobs start from, is as shipped
    (unpacked,) = (docker_procs.root / "t-wd" / "workdirs").glob("*/model.txt")
    assert unpacked.read_text() == "tiny-model\n" and not (unpacked.parent / "here").exists()


def test_the_readme_training_example_runs_shipped_from_the_examples_directory(
    procs: FleetProcs, client: Client
) -> None:
    need_torch()
    procs.one_node(client, "t-ex", gpus=1)
    examples = Path(__file__).resolve().parents[2] / "workers" / "examples"
    argv = [
        sys.executable,
        "-m",
        "fleet",
        "submit",
        "--wait",
        "--follow",
        "--workdir",
        ".",
        "--",
        sys.executable,
        "train_regression.py",
        "--steps",
        "20",
        "--every",
        "10",
    ]
    done = subprocess.run(
        argv, cwd=examples, env=procs.cli_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + procs.logs()
    assert " SUCCEEDED" in done.stdout.splitlines()[-1]


def test_a_node_that_cannot_prepare_attempts_is_quarantined_and_the_job_runs_elsewhere(
    procs: FleetProcs, client: Client, project: Path
) -> None:
    # Given a node whose agent cannot write its workdirs folder (a file stands where it goes), alone
    (procs.root / "t-bad").mkdir()
    (procs.root / "t-bad" / "workdirs").write_text("not a folder\n")
    procs.one_node(client, "t-bad", gpus=1)
    # When a job shipping a directory is submitted
    job = client.submit(JobSpec(name="train", command=[sys.executable, "train.py"], workdir=str(project)))
    # Then after max_prepare_failures (3) attempts in a row the node cordons itself, saying why
    deadline = time.monotonic() + 60
    while client.node("t-bad").admin_state != NodeState.CORDONED and time.monotonic() < deadline:
        time.sleep(0.1)
    bad = client.node("t-bad")
    assert bad.admin_state == NodeState.CORDONED, procs.logs()
    assert bad.reason.startswith("quarantined: 3 attempts in a row could not be prepared on this node"), (
        bad.reason
    )
    assert "workdirs" in bad.reason and "fleet nodes uncordon t-bad" in bad.reason
    # And the job was requeued, not failed, each requeue after the first backed off (0.5 s, then 1 s:
    # no new attempt started before its requeue's delay was over), its infrastructure cap not spent
    history = client.history(job.id)
    requeues = [
        e for e in history if e.state == "QUEUED" and "cannot prepare the attempt on t-bad" in e.reason
    ]
    starts = [e for e in history if e.state == "STARTING"]
    assert len(requeues) == 3 and len(starts) == 3, history
    assert [r.reason.split("; ")[-1] for r in requeues] == [
        "requeued (retry budget not spent)",
        "requeued in 0.5s (retry budget not spent)",
        "requeued in 1s (retry budget not spent)",
    ]
    assert starts[2].at - requeues[1].at >= 0.5
    assert client.get(job.id).state == JobState.QUEUED and client.get(job.id).infra_requeues == 3
    # When a healthy node joins, one whose agent was killed while unpacking before
    stale = procs.root / "t-good" / "workdirs" / f".{'0' * 64}.4242.tmp"
    (stale / "half").mkdir(parents=True)
    procs.agent("t-good", gpus=1)
    # Then the job runs there, and the healthy agent removed the stale temporary directory, saying so
    assert job.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    assert client.get(job.id).nodes_held == ["t-good"] and client.get(job.id).attempt == 4
    assert not stale.exists()
    assert "workdir_temp_cleaned" in (procs.root / "t-good.log").read_text()
    assert client.node("t-bad").admin_state == NodeState.CORDONED


def _archive(members: list[tuple[str, int]]) -> bytes:
    """A tar.gz of files of the given sizes, all zeros (they compress to almost nothing)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, _Zeros(size))
    return buffer.getvalue()


def _empty_files(count: int) -> bytes:
    """A tar.gz of ``count`` empty files ``f0``, ``f1``...: their ustar headers written here, from one
    that tarfile made (tarfile's own ``addfile`` takes seconds of CPU for 100,000 members)."""
    blank = bytearray(tarfile.TarInfo("x").tobuf(tarfile.USTAR_FORMAT))
    blank[0:100], blank[148:156] = bytes(100), b" " * 8  # no name; the checksum counts as spaces
    headers = []
    for i in range(count):
        header, name = bytearray(blank), b"f%d" % i
        header[: len(name)] = name
        header[148:156] = b"%06o\0 " % (sum(blank) + sum(name))
        headers.append(bytes(header))
    return gzip.compress(b"".join(headers) + bytes(1024), compresslevel=1)


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def test_an_upload_that_would_unpack_too_large_or_too_many_is_refused(client: Client) -> None:
    # Given a small upload that unpacks to more than workdir_max_bytes (64 MiB), and one of too many files
    bomb = _archive([("zeros", (64 << 20) + 1)])
    assert len(bomb) < 1 << 20
    many = _empty_files(100_001)
    # Then the API refuses each at upload, before any node unpacks it, naming the limit
    with pytest.raises(SpecError, match=r"more than workdir_max_bytes \(67108864\) unpacked"):
        client.upload_blob(bomb)
    with pytest.raises(SpecError, match="more than 100000 files and folders"):
        client.upload_blob(many)
    # while a directory within both is taken
    assert client.upload_blob(_archive([("a", 10), ("b", (64 << 20) - 10)])).startswith("sha256:")


def _submit_on_terminal(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``argv`` with standard error on a terminal (a pty), as a user's; its exit, stdout, stderr."""
    import pty

    leader, follower = pty.openpty()
    done = subprocess.run(
        argv, cwd=cwd, env={**env, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=follower, timeout=120
    )
    os.close(follower)
    seen = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's other end is closed and read out
        while chunk := os.read(leader, 65536):
            seen += chunk
    os.close(leader)
    return done.returncode, done.stdout.decode(), seen.decode(errors="replace")


def test_on_a_terminal_submit_says_what_it_uploads_and_an_unchanged_directory_is_not_packed_again(
    api: Api, client: Client, project: Path
) -> None:
    for path in project.rglob("*"):  # a project's files, last changed an hour ago
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    argv = [sys.executable, "-m", "fleet", "submit", "--workdir", ".", "--", sys.executable, "train.py"]
    # When a user submits from a terminal, then again with nothing changed, then after an edit
    first = _submit_on_terminal(argv, project, api.env())
    second = _submit_on_terminal(argv, project, api.env())
    (project / "train.py").write_text("print('edited')\n")
    third = _submit_on_terminal(argv, project, api.env())
    # Then each says on stderr what it shipped: packed and uploaded, then unchanged, then uploaded again
    assert [r[0] for r in (first, second, third)] == [0, 0, 0], first[2] + second[2] + third[2]
    digest = digest_of(pack(project))
    assert "workdir .: 5 files" in first[2] and "uploaded" in first[2], first[2]
    assert "unchanged since it was last packed here, and the fleet holds it" in second[2], second[2]
    assert "uploaded" in third[2] and digest[:19] in third[2], third[2]
    # And the jobs name what was shipped: the same digest twice, then the edited tree's
    workdirs = [client.get(r[1].split()[0]).spec.workdir for r in (first, second, third)]
    assert workdirs[0] == workdirs[1] != workdirs[2] == digest
