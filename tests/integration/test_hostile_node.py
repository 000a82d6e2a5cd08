"""Tenants that share a node cannot touch each other: each tenant's jobs run as a uid of its own,
a spec's ``user`` is only one an admin allow-listed for its tenant, and an attempt's files are
private to root and the job.

Real agents, controllers and API, real Redis, real processes; the real Docker daemon where it says so.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import DirectClient, FleetProcs
from fleet import Client, JobSpec, JobState
from fleet.config import load_settings
from fleet.errors import SpecError
from tests.conftest import Api, need, remove_containers
from tests.integration.test_up import Up
from tests.support import wait_for

pytestmark = pytest.mark.integration
#: each tenant's own uid, from the default agent.job_uid_range; never root
PER_TENANT = {"FLEET_AGENT__JOB_USER": "", "FLEET_AGENT__ALLOW_ROOT_JOBS": "false"}
FIRST_UID = 1_000_000_000
SECRET = "alices-secret-7f3a9c"


@pytest.fixture
def as_root() -> None:
    need(os.geteuid() == 0, "jobs switch to their tenant's uid only under a root agent")


@pytest.fixture
def tenants(api: Api) -> Iterator[tuple[Client, Client]]:
    """Clients for alice (tenant a) and bob (tenant b), each a user of its own tenant."""
    yield api.client(api.token_for("alice", "a")), api.client(api.token_for("bob", "b"))


def _fleet(procs: FleetProcs, *argv: str) -> subprocess.CompletedProcess[str]:
    """A ``fleet`` command as the admin, through the API."""
    return subprocess.run(
        [sys.executable, "-m", "fleet", *argv],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _probe(paths: dict[str, str]) -> list[str]:
    """A shell script that says, for each path, whether it could be read (and what it held)."""
    lines = []
    for label, path in paths.items():
        read = "ls" if label.endswith("listing") else "cat"
        lines.append(
            f'if out=$({read} "{path}" 2>&1); then echo "READ {label} $out"; else echo "DENIED {label}"; fi'
        )
    return ["sh", "-c", "; ".join(["id -u", *lines])]


@pytest.mark.parametrize("runtime", ["process"])
def test_another_tenants_job_cannot_read_anything_of_a_running_job(
    as_root: None, procs: FleetProcs, tenants: tuple[Client, Client], client: Client
) -> None:
    # Given alice's job running with a secret in its environment, its work dir, its checkpoint dir
    # and its output
    alice, bob = tenants
    procs.one_node(client, "t-hostile", gpus=1, **PER_TENANT)
    script = (
        'echo "$SECRET" > secret.txt; echo "$SECRET" > "$FLEET_CHECKPOINT_DIR/s"; echo "$SECRET"; sleep 300'
    )
    hers = alice.submit(JobSpec(name="alice", command=["sh", "-c", script], env={"SECRET": SECRET}))
    wait_for(lambda: SECRET in hers.logs(), what="alice's job wrote its secret")
    attempts = procs.root / "t-hostile" / "attempts"
    folder = attempts / f"{hers.id}.1"
    pid = json.loads((folder / "meta.json").read_text())["pid"]
    paths = {
        "environ": f"/proc/{pid}/environ",
        "work": str(folder / "work" / "secret.txt"),
        "checkpoint": str(procs.root / "checkpoints" / hers.id / "s"),
        "output": str(folder / "output.log"),
        "attempts-listing": str(attempts),
        "checkpoints-listing": str(procs.root / "checkpoints"),
        "state-listing": str(attempts.parent),
    }
    for label in ("environ", "work", "checkpoint", "output"):  # they are there, and hold it
        assert SECRET in Path(paths[label]).read_bytes().decode(errors="replace"), label

    # When bob's job, on the same node, tries to read each of them and to list the jobs' folders
    his = bob.submit(JobSpec(name="bob", command=_probe(paths)))
    status = his.wait(timeout=60)
    lines = his.logs().splitlines()

    # Then it runs as a uid of its own tenant, and every one of them is denied
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert lines[0] == str(FIRST_UID + 1), lines  # alice's tenant took the first
    assert lines[1:] == [f"DENIED {label}" for label in paths], lines
    assert SECRET not in his.logs()
    # And the files are root's alone; the folders are passed through, never listed
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {
        "meta.json": 0o600,
        "output.log": 0o600,
        "work": 0o700,
    }
    passed = (attempts.parent, attempts, folder, procs.root / "checkpoints")
    assert [stat.S_IMODE(p.stat().st_mode) for p in passed] == [0o711] * 4
    alice.cancel(hers.id)


@pytest.mark.parametrize("runtime", ["process"])
def test_an_elastic_jobs_batch_is_read_only_to_it_and_hidden_from_another_tenant(
    as_root: None, procs: FleetProcs, tenants: tuple[Client, Client], client: Client
) -> None:
    # Given alice's elastic job, which reads its batch from its control folder and tries to change it
    alice, bob = tenants
    procs.one_node(client, "t-control", gpus=1, **PER_TENANT)
    own = '"$FLEET_CONTROL_DIR/batch_size"'
    script = (
        f"echo batch $(cat {own}); echo 4096 > {own} 2>/dev/null && echo WROTE;"
        ' touch "$FLEET_CONTROL_DIR/x" 2>/dev/null && echo CREATED; echo done; sleep 300'
    )
    spec = {"name": "alice", "command": ["sh", "-c", script], "gpus": {"min": 1, "max": 1}}
    hers = alice.submit(JobSpec.parse({**spec, "batch_size": {"min": 64, "max": 128}, "profile": "learn"}))
    wait_for(lambda: "done" in hers.logs(), what="alice's job tried its control folder")
    # Then it read its batch and could change nothing there
    said = hers.logs().splitlines()
    assert said[0] == "batch 64" and said[-1] == "done" and not {"WROTE", "CREATED"} & set(said), said
    control = procs.root / "t-control" / "attempts" / f"{hers.id}.1" / "control"
    assert (control / "batch_size").read_text() == "64\n"
    assert (stat.S_IMODE(control.stat().st_mode), control.stat().st_uid) == (0o750, 0)
    # When bob's job, on the same node, tries to read it
    his = bob.submit(JobSpec(name="bob", command=_probe({"control": str(control / "batch_size")})))
    # Then it is denied
    assert his.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    assert his.logs().splitlines()[1:] == ["DENIED control"], his.logs()
    alice.cancel(hers.id)


@pytest.mark.parametrize("runtime", ["process"])
@pytest.mark.parametrize("user", ["102:105", "65534:0"])
def test_a_host_user_the_tenant_was_not_allowed_is_refused_at_submit(
    procs: FleetProcs, tenants: tuple[Client, Client], client: Client, tmp_path: Path, user: str
) -> None:
    # When a user's job asks to run as a host account (redis's, or nobody with root's group)
    alice, _ = tenants
    with pytest.raises(SpecError) as err:
        alice.submit(JobSpec(name="x", command=["true"], user=user))
    # Then it is refused naming the field and the fix
    assert f"user {user!r}: " in str(err.value) and "drop `user`" in str(err.value)
    # And the CLI exits 2 with the same words, the command an admin would run included
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "x", "command": ["true"], "user": user}))
    cli = _fleet(procs, "submit", "-f", str(spec))
    assert cli.returncode == 2 and f"user {user!r}: " in cli.stderr, cli.stderr
    if user == "102:105":
        assert "`fleet tenant set default --allow-user 102:105`" in cli.stderr
    else:
        assert "gid 0 is root's group and never allowed" in cli.stderr
    # And nothing was queued
    assert client.jobs() == []


@pytest.mark.parametrize("runtime", ["process"])
def test_an_allow_listed_user_runs_as_that_uid_with_no_other_group(
    as_root: None, procs: FleetProcs, client: Client
) -> None:
    # Given an admin who allowed tenant default the host user 4242:4343
    procs.one_node(client, "t-hostile", gpus=1, **PER_TENANT)
    allow = _fleet(procs, "tenant", "set", "default", "--allow-user", "4242:4343")
    assert allow.returncode == 0 and "host users its jobs may name: 4242:4343" in allow.stdout, allow.stderr
    # When a job names it
    job = client.submit(JobSpec(name="as", command=["sh", "-c", "id -u; id -g; id -G"], user="4242:4343"))
    status = job.wait(timeout=60)
    # Then it runs as that uid and gid, in no other group
    assert status.state == JobState.SUCCEEDED, procs.logs()
    assert job.logs().splitlines() == ["4242", "4343", "4343"]
    # And once the admin takes it off the list, a job naming it is refused again
    drop = _fleet(procs, "tenant", "set", "default", "--disallow-user", "4242:4343")
    assert drop.returncode == 0 and "host users its jobs may name: none" in drop.stdout, drop.stderr
    with pytest.raises(SpecError, match="user '4242:4343': tenant default's jobs may not run as host user"):
        client.submit(JobSpec(name="as", command=["true"], user="4242:4343"))


@pytest.mark.parametrize("runtime", ["process"])
def test_a_tenant_keeps_its_uid_on_every_node_and_attempt(
    as_root: None, procs: FleetProcs, tenants: tuple[Client, Client], client: Client
) -> None:
    # Given two nodes whose GPUs tell them apart
    alice, bob = tenants
    procs.controller()
    procs.agent("t-hostile-1", gpus=1, FLEET_AGENT__SIMULATED_GPU_MODEL="Sim Alpha", **PER_TENANT)
    procs.agent("t-hostile-2", gpus=1, FLEET_AGENT__SIMULATED_GPU_MODEL="Sim Beta", **PER_TENANT)
    procs.wait_nodes(client, 2)
    # When bob runs a job first, then alice one on each node, the first failing its first attempt
    flaky = 'id -u; id -g; test "$FLEET_ATTEMPT" = 2'
    first = bob.submit(JobSpec(name="b", command=["id", "-u"]))
    assert first.wait(timeout=60).state == JobState.SUCCEEDED, procs.logs()
    jobs = [
        alice.submit(
            JobSpec(name=f"a-{model}", command=["sh", "-c", flaky], gpus=1, gpu_model=model, max_attempts=2)
        )
        for model in ("alpha", "beta")
    ]
    ended = [j.wait(timeout=90) for j in jobs]
    # Then each of alice's attempts, on either node, ran as alice's uid; bob's was another
    assert [(e.state, e.attempt, e.node) for e in ended] == [
        (JobState.SUCCEEDED, 2, "t-hostile-1"),
        (JobState.SUCCEEDED, 2, "t-hostile-2"),
    ], procs.logs()
    assert first.logs() == str(FIRST_UID)
    mine = str(FIRST_UID + 1)
    assert [j.logs(attempt=a).splitlines() for j in jobs for a in (1, 2)] == [[mine, mine]] * 4


@pytest.mark.docker
def test_tenants_containers_run_as_their_own_uids_and_cannot_read_each_others_checkpoints(
    as_root: None, docker_procs: FleetProcs, tenants: tuple[Client, Client], client: Client
) -> None:
    # Given a Docker node whose operator lets jobs mount the checkpoint storage (a shared file system)
    root = docker_procs.root / "checkpoints"
    root.mkdir(mode=0o711)
    docker_procs.controller()
    docker_procs.agent("t-hostile-dock", gpus=1, FLEET_ALLOWED_MOUNTS=json.dumps([str(root)]), **PER_TENANT)
    docker_procs.wait_nodes(client, 1)
    backend = DirectClient(settings=load_settings(redis_url=docker_procs.redis_url, allowed_mounts=[root]))
    try:
        # When tenant a's container writes a checkpoint, and tenant b's mounts the storage and reads it
        mine = backend.submit(
            JobSpec(
                name="a",
                tenant="a",
                command=["sh", "-c", f'id -u; echo {SECRET} > "$FLEET_CHECKPOINT_DIR/s"'],
            )
        )
        assert mine.wait(timeout=60).state == JobState.SUCCEEDED, docker_procs.logs()
        probe = (
            f"id -u; cat /shared/{mine.id}/s 2>&1 || echo DENIED; ls /shared/{mine.id} 2>&1 || echo DENIED"
        )
        theirs = backend.submit(
            JobSpec(
                name="b",
                tenant="b",
                command=["sh", "-c", probe],
                mounts=[{"source": str(root), "target": "/shared"}],
            )
        )
        assert theirs.wait(timeout=60).state == JobState.SUCCEEDED, docker_procs.logs()
        # Then the containers ran as two uids, and b's could read nothing of a's checkpoint dir
        lines = theirs.logs().splitlines()
        assert mine.logs() == str(FIRST_UID) and lines[0] == str(FIRST_UID + 1), lines
        assert lines[-1] == "DENIED" and lines.count("DENIED") == 2 and SECRET not in theirs.logs(), lines
        assert (root / mine.id / "s").read_text().strip() == SECRET  # it is there
    finally:
        backend.close()
        remove_containers("t-hostile-dock")


def _who_runs_fleet_ups_jobs(tmp_path: Path, **env: str) -> tuple[list[str], str]:
    """Start `fleet up` with ``env``, run a job that says who it is, stop it: its lines, fleet up's output."""
    up = Up(tmp_path)
    up.start(**env)
    try:
        client = up.wait_up()
        try:
            job = client.submit({"name": "who", "command": ["sh", "-c", "id -u; id -g"]})
            assert job.wait(timeout=60).state == JobState.SUCCEEDED, up.output()
            return job.logs().splitlines(), up.output()
        finally:
            client.close()
    finally:
        assert up.proc is not None
        up.proc.send_signal(signal.SIGTERM)
        up.proc.wait(timeout=60)
        up.kill_all()


@pytest.mark.parametrize("user", ["nobody", "daemon"])
def test_fleet_up_under_sudo_runs_jobs_as_the_person_who_ran_sudo(
    as_root: None, tmp_path: Path, user: str
) -> None:
    # Given `fleet up` started by root through sudo, by an unprivileged user
    # When a job says who it is
    lines, output = _who_runs_fleet_ups_jobs(tmp_path, SUDO_USER=user)
    # Then it ran as that user, with the user's group, and fleet up said nothing of root
    entry = pwd.getpwnam(user)
    assert lines == [str(entry.pw_uid), str(entry.pw_gid)], output
    assert "jobs run as root" not in output


def test_fleet_up_started_by_root_runs_jobs_as_root_and_says_so(as_root: None, tmp_path: Path) -> None:
    # When root starts `fleet up` itself (no sudo) and a job says who it is
    lines, output = _who_runs_fleet_ups_jobs(tmp_path, SUDO_USER="")
    # Then it ran as root, as the person who started it, and fleet up said so and how to avoid it
    assert lines == ["0", "0"], output
    assert "started by root, so its jobs run as root; start it from your own account" in output
