"""Kept outputs and checkpoints fetched with ``fleet download``: real processes on the process
runtime (and real containers on the Docker daemon), an API of the fleet's own that reads the fleet's
checkpoint storage."""

from __future__ import annotations

import grp
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet import Client, JobState
from fleet.errors import ConfigError
from tests.conftest import Api, FleetProcs
from tests.support import start_api, wait_for

pytestmark = pytest.mark.integration

Run = Callable[..., subprocess.CompletedProcess[str]]

#: writes outputs/result.txt (and outputs/sub/deep.txt) and a checkpoint, then exits $1
WRITER = (
    'mkdir -p outputs/sub && echo "result of $FLEET_ATTEMPT" > outputs/result.txt && '
    "echo deep > outputs/sub/deep.txt && "
    'echo "weights $FLEET_ATTEMPT" > "$FLEET_CHECKPOINT_DIR/ckpt-$FLEET_ATTEMPT" && '
    "printf 'ckpt-%s\\n%s\\n' $FLEET_ATTEMPT $FLEET_ATTEMPT > \"$FLEET_CHECKPOINT_DIR/latest\" && exit $1"
)


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def fleet_cli(procs: FleetProcs, client: Client, api: Api, storage_api: tuple[str, Path]) -> Run:
    """A fleet with one node and an API that sees its checkpoint_root (the module's fleets share it)."""
    return _fleet_cli(procs, client, api, "t-outputs", storage=storage_api)


@pytest.fixture
def docker_cli(docker_procs: FleetProcs, client: Client, api: Api, storage_api: tuple[str, Path]) -> Run:
    """The same on the Docker runtime (a node name of its own: the daemon is shared)."""
    return _fleet_cli(docker_procs, client, api, "t-outputs-docker", storage=storage_api)


def _fleet_cli(
    procs: FleetProcs,
    client: Client,
    api: Api,
    node: str,
    storage: tuple[str, Path] | None = None,
    **agent_env: str,
) -> Run:
    """The fleet's ``fleet`` command, through an API that reads its checkpoint storage: the
    module's (``storage``), or one of the fleet's own."""
    if storage:
        procs.share_checkpoints(storage[1])
    procs.controller()
    procs.agent(node, gpus=1, **agent_env)
    url = storage[0] if storage else start_api(procs, "api-outputs")
    procs.wait_nodes(client, 1)

    def run(
        *args: str, token: str | None = None, cwd: Path | None = None, via: str = url
    ) -> subprocess.CompletedProcess[str]:
        env = {**api.env(token), "FLEET_API_URL": via}
        return subprocess.run(
            [sys.executable, "-m", "fleet", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=cwd,
        )

    run.url = url  # type: ignore[attr-defined]
    return run


def submit(fleet_cli: Run, script: str, *args: str) -> str:
    done = fleet_cli("submit", "--max-attempts", "2", *args, "--wait", "--", "sh", "-c", script, "sh")
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.split()[0]


def test_outputs_and_checkpoints_are_downloaded_after_success_and_failure(
    fleet_cli: Run, client: Client, tmp_path: Path
) -> None:
    # Given a job that succeeds, and one whose two attempts each write outputs and a checkpoint and fail
    ok = submit(fleet_cli, WRITER + " 0")
    failed = submit(fleet_cli, WRITER + " $FLEET_ATTEMPT")
    assert client.get(ok).state == JobState.SUCCEEDED
    assert client.get(failed).state == JobState.FAILED and client.get(failed).attempt == 2
    # When each is downloaded
    for job_id, attempt in ((ok, 1), (failed, 2)):
        into = tmp_path / job_id
        fetched = fleet_cli("download", job_id, "-o", str(into))
        assert fetched.returncode == 0, fetched.stderr
        # Then the latest attempt's outputs are there, and its checkpoint
        assert (into / "result.txt").read_text() == f"result of {attempt}\n"
        assert (into / "sub" / "deep.txt").read_text() == "deep\n"
        assert sorted(fetched.stdout.split()) == sorted(
            [str(into / "result.txt"), str(into / "sub/deep.txt")]
        )
        ckpt = fleet_cli("download", job_id, "--checkpoint", "latest", "-o", str(tmp_path / f"{job_id}-ckpt"))
        assert ckpt.returncode == 0, ckpt.stderr
        assert (tmp_path / f"{job_id}-ckpt" / f"ckpt-{attempt}").read_text() == f"weights {attempt}\n"
    # a checkpoint by name, a part of the outputs, and `fleet show` says what is kept
    older = fleet_cli("download", failed, "--checkpoint", "ckpt-1", "-o", str(tmp_path / "older"))
    assert older.returncode == 0 and (tmp_path / "older" / "ckpt-1").read_text() == "weights 1\n"
    part = fleet_cli("download", ok, "sub", "-o", str(tmp_path / "part"))
    assert part.returncode == 0 and os.listdir(tmp_path / "part") == ["deep.txt"]
    shown = json.loads(fleet_cli("show", ok, "-o", "json").stdout)
    assert (shown["outputs_bytes"], shown["outputs_attempt"]) == (len("result of 1\ndeep\n"), 1)
    assert "Outputs:    17 B kept from outputs/ of attempt 1" in fleet_cli("show", ok).stdout
    # and nothing is overwritten without --force; the current directory's ./JOB by default
    again = fleet_cli("download", ok, "-o", str(tmp_path / ok))
    assert again.returncode == 2 and f"{tmp_path / ok}/result.txt exists: give --force" in again.stderr
    (tmp_path / ok / "result.txt").write_text("mine\n")
    assert fleet_cli("download", ok, "-o", str(tmp_path / ok), "--force").returncode == 0
    assert (tmp_path / ok / "result.txt").read_text() == "result of 1\n"
    assert fleet_cli("download", ok, cwd=tmp_path / "part").returncode == 0
    assert (tmp_path / "part" / ok / "result.txt").read_text() == "result of 1\n"
    # Bad paths and names are refused before anything is read
    for bad in (["../x"], ["/etc"], ["--checkpoint", "../latest"]):
        refused = fleet_cli("download", ok, *bad, "-o", str(tmp_path / "bad"))
        assert refused.returncode == 2, refused.stderr
    assert not (tmp_path / "bad").exists()


def test_a_link_to_a_root_only_file_is_not_followed(
    fleet_cli: Run, procs: FleetProcs, tmp_path: Path
) -> None:
    # Given a file only root may read, and a job whose outputs hold links to it and to /
    secret = procs.root / "secret.txt"
    secret.write_text("TOPSECRET\n")
    secret.chmod(0o600)
    script = (
        f"mkdir outputs && ln -s {secret} outputs/leak && ln -s / outputs/root && echo ok > outputs/ok.txt"
    )
    job_id = submit(fleet_cli, script)
    # When its outputs are downloaded
    fetched = fleet_cli("download", job_id, "-o", str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    # Then only its own file came, and the links were left out, said so on the job
    assert os.listdir(tmp_path / "got") == ["ok.txt"]
    assert "2 links, devices or files not the job's own left out" in fleet_cli("show", job_id).stdout


def test_a_cancelled_jobs_outputs_are_kept(fleet_cli: Run, procs: FleetProcs, tmp_path: Path) -> None:
    # Given a running job that wrote its outputs and sleeps
    script = "mkdir outputs && echo partial > outputs/p.txt && sleep 600"
    job_id = fleet_cli("submit", "--", "sh", "-c", script).stdout.strip()
    written = procs.root / "t-outputs" / "attempts" / f"{job_id}.1" / "work" / "outputs" / "p.txt"
    wait_for(written.exists, timeout=30, what="the job's outputs written")
    # When it is cancelled
    assert fleet_cli("cancel", job_id).returncode == 0
    assert fleet_cli("wait", job_id, "--timeout", "30").returncode == 6
    # Then what it wrote is kept
    fetched = fleet_cli("download", job_id, "-o", str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "got" / "p.txt").read_text() == "partial\n"


def test_another_tenants_job_is_no_such_job(fleet_cli: Run, api: Api, tmp_path: Path) -> None:
    # Given a job of tenant default with outputs
    job_id = submit(fleet_cli, WRITER + " 0")
    # When a user of another tenant asks for them (or its checkpoint)
    stranger = api.token_for("mallory", "other")
    for extra in ([], ["--checkpoint", "latest"]):
        denied = fleet_cli("download", job_id, *extra, "-o", str(tmp_path / "x"), token=stranger)
        # Then the job is as missing as one that never was
        assert denied.returncode == 3, denied.stderr
        assert denied.stderr == f"fleet: no job {job_id!r} (list jobs with `fleet jobs`)\n"
    assert not (tmp_path / "x").exists()
    # while a user of its own tenant gets them
    own = api.token_for("alice", "default")
    assert fleet_cli("download", job_id, "-o", str(tmp_path / "y"), token=own).returncode == 0


def test_outputs_over_the_quota_are_not_kept_and_the_job_still_succeeds(
    fleet_cli: Run, client: Client, tmp_path: Path
) -> None:
    # Given a tenant whose kept outputs may hold 1 KiB, and a job of it that writes 4 KiB
    client.set_tenant("small", outputs_quota=1024)
    job_id = submit(fleet_cli, "mkdir outputs && head -c 4096 /dev/zero > outputs/big", "--tenant", "small")
    # Then it succeeded, its outputs are not kept and it says why
    job = client.get(job_id)
    assert job.state == JobState.SUCCEEDED and job.outputs_bytes is None
    assert job.outputs_note == (
        "outputs of attempt 1 not kept (outputs/): tenant small's kept outputs may hold 1.0 KiB and "
        "its other jobs' hold 0 B"
    )
    missing = fleet_cli("download", job_id, "-o", str(tmp_path / "none"))
    assert missing.returncode == 3 and "has no kept outputs: outputs of attempt 1 not kept" in missing.stderr


def test_an_api_that_cannot_see_the_checkpoint_storage_says_to_mount_it(
    fleet_cli: Run, client: Client, tmp_path: Path
) -> None:
    # Given a job with outputs, and the session's API, whose checkpoint_root is not on its host
    job_id = submit(fleet_cli, WRITER + " 0")
    # Then a download through it names the setting and the fix
    with pytest.raises(ConfigError, match="is not on the API's host: mount the checkpoint storage"):
        client.download(job_id, dest=tmp_path / "z")


def test_a_containers_outputs_are_kept_with_or_without_a_shipped_workdir(
    docker_cli: Run, docker_procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given a file only root may read on the node, and a project directory to ship
    secret = docker_procs.root / "secret.txt"
    secret.write_text("TOPSECRET\n")
    secret.chmod(0o600)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.sh").write_text(WRITER.replace("exit $1", f"ln -s {secret} outputs/leak; exit 0"))
    # When a container job ships it and runs it in its working directory
    shipped = docker_cli("submit", "--workdir", str(project), "--wait", "--", "sh", "train.sh", cwd=project)
    assert shipped.returncode == 0, shipped.stderr + docker_procs.logs()
    # and another ships nothing and writes outputs/ in its image's working directory
    bare = submit(docker_cli, WRITER + " 0")
    # Then each one's outputs and checkpoint are downloaded as the job left them
    for job_id in (shipped.stdout.split()[0], bare):
        assert client.get(job_id).state == JobState.SUCCEEDED
        into = tmp_path / job_id
        fetched = docker_cli("download", job_id, "-o", str(into))
        assert fetched.returncode == 0, fetched.stderr
        assert (into / "result.txt").read_text() == "result of 1\n"
        assert (into / "sub" / "deep.txt").read_text() == "deep\n"
        ckpt = docker_cli("download", job_id, "--checkpoint", "latest", "-o", str(tmp_path / f"{job_id}-c"))
        assert ckpt.returncode == 0 and (tmp_path / f"{job_id}-c" / "ckpt-1").read_text() == "weights 1\n"
    # And the link to the root-only file was left out, not followed, and said so
    assert sorted(os.listdir(tmp_path / shipped.stdout.split()[0])) == ["result.txt", "sub"]
    shown = docker_cli("show", shipped.stdout.split()[0]).stdout
    assert "1 links, devices or files not the job's own left out" in shown
    # and nothing of the attempts is left on the node once they ended
    assert os.listdir(docker_procs.root / "t-outputs-docker" / "attempts") == []


#: a group every Debian system has, none of whose members runs jobs here: the storage group below
GROUP = "daemon"
NOBODY = 65534


def test_an_api_in_the_storage_group_reads_what_is_kept_and_other_users_cannot(
    procs: FleetProcs, client: Client, api: Api, tmp_path: Path
) -> None:
    # Given nodes whose storage group (the API's) is GROUP, and a job that kept outputs and a checkpoint
    fleet_cli = _fleet_cli(procs, client, api, "t-outputs-group", FLEET_STORAGE_GROUP=GROUP)
    gid = grp.getgrnam(GROUP).gr_gid
    job_id = submit(fleet_cli, WRITER + " 0")
    # Then what was kept is root's and the group's, and nothing of it is anyone else's to read
    kept = procs.root / "checkpoints" / ".fleet-outputs" / "default" / job_id
    for path in [kept.parent.parent, kept.parent, kept, *kept.rglob("*")]:
        info = path.stat()
        assert (info.st_uid, info.st_gid) == (0, gid), path
        assert stat.S_IMODE(info.st_mode) == (0o750 if path.is_dir() else 0o640), path
    ckpt = (procs.root / "checkpoints" / job_id).stat()
    assert (ckpt.st_gid, stat.S_IMODE(ckpt.st_mode)) == (gid, 0o2750)
    # When an API runs as an unprivileged user in that group, as `fleet install api`'s unit does
    member = start_api(procs, "api-member", user=NOBODY, group=NOBODY, extra_groups=[gid])
    # Then it serves the job's outputs and its checkpoint
    got = fleet_cli("download", job_id, "-o", str(tmp_path / "got"), via=member)
    assert got.returncode == 0, got.stderr
    attempt = client.get(job_id).attempt  # 1, unless a loaded machine lost the first
    assert (tmp_path / "got" / "result.txt").read_text() == f"result of {attempt}\n"
    got = fleet_cli("download", job_id, "--checkpoint", "latest", "-o", str(tmp_path / "ck"), via=member)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "ck" / f"ckpt-{attempt}").read_text() == f"weights {attempt}\n"
    # while the same user outside the group reads neither, and is told how to fix it
    outsider = start_api(procs, "api-outsider", user=NOBODY, group=NOBODY, extra_groups=[])
    for extra in ([], ["--checkpoint", "latest"]):
        denied = fleet_cli("download", job_id, *extra, "-o", str(tmp_path / "no"), via=outsider)
        assert denied.returncode != 0 and "run the API in the storage group" in denied.stderr, denied.stderr
    assert not (tmp_path / "no").exists()


def test_a_job_whose_group_is_the_storage_group_is_refused(
    procs: FleetProcs, client: Client, api: Api
) -> None:
    # Given a node that runs every job as nobody with the storage group's gid
    gid = grp.getgrnam(GROUP).gr_gid
    env = {"FLEET_STORAGE_GROUP": GROUP, "FLEET_AGENT__JOB_USER": f"{NOBODY}:{gid}"}
    fleet_cli = _fleet_cli(procs, client, api, "t-outputs-gid", **env)
    # When a job is submitted, it does not run: it could read every tenant's kept outputs
    done = fleet_cli("submit", "--wait", "--", "sh", "-c", "echo ran")
    job = client.get(done.stdout.split()[0])
    assert job.state == JobState.FAILED and job.attempt == 1, job.reason
    assert f"user: gid {gid} is the storage group's ({GROUP})" in job.reason
    assert "run the job with another group" in job.reason
