"""Displays that tell the truth: ``fleet show`` says who submitted a job, its time limit and the time
left, its labels, its environment's names (never values), its workdir (digest and size) and the
jobs it waits for; a job that never started shows no ticking ELAPSED; ``fleet jobs --label
fleet.array=ID`` lists an array's tasks; ``fleet top`` counts queued array tasks, as they are now
(no leader has published anything here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState
from tests.conftest import Api, FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def cli(api: Api, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args], env=api.env(), capture_output=True, text=True, timeout=60
    )


def test_show_tells_the_user_the_time_left_labels_env_names_and_workdir(
    procs: FleetProcs, client: Client, api: Api, tmp_path: Path
) -> None:
    procs.one_node(client, "t-show", gpus=1)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "run.sh").write_text("sleep 60\n")
    # Given a running job with a time limit, labels, a secret in its environment, and shipped code
    spec = JobSpec(
        name="long",
        command=["sh", "run.sh"],
        gpus=1,
        timeout=600,
        labels={"exp": "7", "team": "vision"},
        env={"WANDB_API_KEY": "s3cret-value", "SEED": "1"},
        workdir=str(tmp_path / "code"),
    )
    job = client.submit(spec)
    wait_for(lambda: job.status().state == JobState.RUNNING, timeout=60, what="the job to run")
    # When the user shows it
    shown = cli(api, "show", job.id)
    # Then it says who submitted it, the limit and the time left, labels, env names, the workdir's digest
    assert shown.returncode == 0, shown.stderr
    fields = dict(re.findall(r"^(\w[\w ]*?):\s+(.*)$", shown.stdout, re.MULTILINE))
    assert fields["User"] == "tester"
    assert re.fullmatch(r"10m00s an attempt, [89]m\d\ds left", fields["Time limit"]), fields["Time limit"]
    assert fields["Labels"] == "exp=7 team=vision"
    assert fields["Env"] == "SEED WANDB_API_KEY"
    digest = client.get(job.id).spec.workdir or ""
    assert fields["Workdir"] == f"{digest[:19]}… (9 B, 1 file; {fields['Workdir'].split('; ')[1]}"
    # and never an environment variable's value
    assert "s3cret-value" not in shown.stdout
    job.cancel()


def test_show_tells_the_size_of_the_shipped_directory_as_uploaded(
    client: Client, api: Api, tmp_path: Path
) -> None:
    # Given a job shipped with a directory of three files (one in a folder) and a link
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")  # 9 bytes
    (code / "pkg" / "model.py").write_bytes(b"x" * 2000)
    (code / "README").write_text("")
    (code / "main.py").symlink_to("train.py")
    job = client.submit(JobSpec(name="shipped", command=["python3", "train.py"], workdir=str(code)))
    digest = client.get(job.id).spec.workdir or ""
    # When the user shows it, as text and as JSON
    shown, as_json = cli(api, "show", job.id), cli(api, "show", job.id, "-o", "json")
    # Then both say what it holds (files and links, their bytes, the archive's), as the API found it
    assert shown.returncode == 0 and as_json.returncode == 0, shown.stderr + as_json.stderr
    size = json.loads(as_json.stdout)["spec"]["workdir_size"]
    assert (size["bytes"], size["files"]) == (2009, 4) and 0 < size["packed"] < 2009
    line = re.search(r"^Workdir:\s+(.*)$", shown.stdout, re.MULTILINE)
    assert line is not None, shown.stdout
    assert line[1] == f"{digest[:19]}… (2.0 KiB, 4 files; {size['packed']} B packed)"
    # And a size a client sends with a spec is replaced by what was uploaded
    forged = client.submit(
        {
            "name": "forged",
            "command": ["true"],
            "workdir": digest,
            "workdir_size": {"packed": 1, "bytes": 1, "files": 1},
        }
    )
    assert client.get(forged.id).spec.workdir_size == client.get(job.id).spec.workdir_size

    # And a job waiting for both shows each with what it waits for
    waiting = client.submit(JobSpec(name="after", command=["true"]), after=[job, f"{forged.id}:any"])
    line = re.search(r"^After:\s+(.*)$", cli(api, "show", waiting.id).stdout, re.MULTILINE)
    assert line is not None and line[1] == f"{job.id} (ok), {forged.id} (any)"


def test_elapsed_of_a_job_that_never_started_does_not_tick(client: Client, api: Api) -> None:
    # Given a job cancelled while it waited (no controller runs: it never starts), and one still queued
    cancelled = client.submit(JobSpec(name="never", command=["true"]))
    cancelled.cancel()
    waiting = client.submit(JobSpec(name="waits", command=["true"]))
    # When the user lists them
    listed = cli(api, "jobs")
    # Then neither shows a START or an ELAPSED: no run time to count
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    header = listed.stdout.splitlines()[0].split()
    for job_id in (cancelled.id, waiting.id):
        row = dict(zip(header, rows[job_id], strict=False))
        assert (row["START"], row["ELAPSED"]) == ("-", "-"), listed.stdout
    assert rows[cancelled.id][1] == "CANCELLED"


def test_jobs_label_fleet_array_lists_the_arrays_tasks(client: Client, api: Api) -> None:
    # Given an array of three tasks, and another job carrying a label of its own
    array = client.submit_array(JobSpec(name="sweep", command=["true"], labels={"exp": "9"}), "0-2")
    other = client.submit(JobSpec(name="single", command=["true"], labels={"exp": "9"}))
    # When the user lists by the array's label, by the shared label, and by both
    by_array = cli(api, "jobs", "--label", f"fleet.array={array.id}", "-o", "json")
    by_exp = cli(api, "jobs", "--label", "exp=9", "-o", "json")
    by_both = cli(api, "jobs", "--label", "exp=9", "--label", "fleet.array.index=1", "-o", "json")
    # Then each finds the tasks (and jobs) carrying every label given, one by one
    assert by_array.returncode == 0, by_array.stderr
    assert sorted(j["id"] for j in json.loads(by_array.stdout)) == [f"{array.id}-{i}" for i in range(3)]
    assert sorted(j["id"] for j in json.loads(by_exp.stdout)) == sorted(
        [other.id, *(f"{array.id}-{i}" for i in range(3))]
    )
    assert [j["id"] for j in json.loads(by_both.stdout)] == [f"{array.id}-1"]
    # and the human listing too
    human = cli(api, "jobs", "--label", f"fleet.array={array.id}")
    assert sorted(line.split()[0] for line in human.stdout.splitlines()[1:]) == [
        f"{array.id}-{i}" for i in range(3)
    ]


def test_top_counts_queued_array_tasks_as_they_are_now(client: Client, api: Api) -> None:
    # Given five array tasks and two jobs queued, and no leader to publish any status
    client.submit_array(JobSpec(name="sweep", command=["true"]), "0-4")
    client.submit(JobSpec(name="one", command=["true"]))
    client.submit(JobSpec(name="two", command=["true"]))
    # When the user looks at the fleet
    top = cli(api, "top", "--once", "-o", "json")
    shown = cli(api, "top", "--once")
    # Then every queued job counts, the array's tasks among them, at once
    assert top.returncode == 0, top.stderr
    pending = {t["tenant"]["name"]: t["jobs_pending"] for t in json.loads(top.stdout)["tenants"]}
    assert pending == {"default": 7}
    assert "0 running, 7 queued" in shown.stdout, shown.stdout
    # and a cancelled task leaves the count at once
    client.cancel(client.jobs(JobState.QUEUED)[0].id)
    again = json.loads(cli(api, "top", "--once", "-o", "json").stdout)
    assert {t["tenant"]["name"]: t["jobs_pending"] for t in again["tenants"]} == {"default": 6}
