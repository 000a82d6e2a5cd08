"""An elastic torch job's gradient noise scale, live: the DDP example (two gloo workers on CPU)
estimates it from its own gradients, reports it with its samples/s, and fleet keeps it with the job,
across a resize, and shows the job's efficiency and goodput at its batch; one that follows a batch
change while it runs takes a new batch up in place, without a restart."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from fleet import Client, JobSpec, JobState
from fleet.scheduler.goodput import efficiency
from tests.conftest import Api, FleetProcs, need_torch
from tests.support import wait_for

pytestmark = pytest.mark.integration
EXAMPLE = str(Path(__file__).resolve().parents[2] / "workers" / "examples" / "train_elastic.py")


@pytest.fixture
def runtime() -> str:
    need_torch()
    return "process"


def test_a_ddp_job_reports_its_noise_scale_and_fleet_shows_its_goodput(
    procs: FleetProcs, client: Client, api: Api, tmp_path: Path
) -> None:
    # Given a node of 2 GPUs and a controller that leaves elastic jobs at the size they are given
    procs.env.update(FLEET_CONTROLLER__ELASTIC="false")
    procs.one_node(client, "gns-a", gpus=2)
    # When the example runs on 2 GPUs (two DDP workers) at batch 64, its smallest, reading its batch
    # at start only (so that a change of its batch restarts it)
    command = [sys.executable, EXAMPLE, "--steps", "100000", "--every", "5", "--sleep", "0.02"]
    command += ["--done-file", str(tmp_path / "done"), "--no-follow"]
    spec = {"name": "gns", "command": command, "gpus": {"min": 2, "max": 2}, "profile": "learn"}
    job = client.submit(JobSpec.parse({**spec, "batch_size": {"min": 64, "max": 512}}))
    # Then its reports carry a noise scale, and fleet keeps it with the job
    wait_for(lambda: job.status().noise_scale > 0, timeout=90, what="a noise scale reported")
    first = job.status()
    assert first.state == JobState.RUNNING and (first.num_gpus, first.batch_size) == (2, 64)
    assert first.progress is not None and first.progress.metrics["batch_size"] == 64
    # When it is resized to batch 256: it resumes from its checkpoint, noise scale estimate included
    client.resize(job.id, 2, batch_size=256)
    wait_for(
        lambda: (
            (s := job.status()).attempt == 2
            and s.progress is not None
            and s.progress.metrics.get("batch_size") == 256
            and "samples_per_s" in s.progress.metrics
        ),
        timeout=90,
        what="reports at batch 256",
    )
    # Then `fleet show` gives its noise scale, the efficiency of batch 256 against 64, and its goodput
    shown = subprocess.run(
        [sys.executable, "-m", "fleet", "show", job.id],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    found = re.search(
        r"Goodput: +noise scale ([\d,.]+) samples; efficiency ([\d.]+) at batch 256 \(tuned at 64\)", shown
    )
    assert found, shown
    # (of the noise scale it shows: the job reports every 0.1 s, so a status read before may be older)
    worth = efficiency(256, float(found[1].replace(",", "")), 64)
    assert float(found[2]) == pytest.approx(worth, abs=0.006) and worth < 1
    assert "goodput" in shown
    # And the status page says the same
    auth = {"Authorization": f"Bearer {api.token}"}
    page = urllib.request.Request(f"{api.url}/ui/jobs/{job.id}", headers=auth)
    html = urllib.request.urlopen(page, timeout=30).read().decode()
    assert re.search(r'id="job-goodput">noise scale [\d,.]+ samples; efficiency [\d.]+ at batch 256', html), (
        html
    )
    (tmp_path / "done").touch()
    assert job.wait(timeout=60).state == JobState.SUCCEEDED


def test_a_job_that_follows_its_batch_takes_a_new_one_up_where_it_runs(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given the example on 2 GPUs (two DDP workers) at batch 64, following its batch as it runs
    procs.env.update(FLEET_CONTROLLER__ELASTIC="false")
    procs.one_node(client, "follow-a", gpus=2)
    command = [sys.executable, EXAMPLE, "--steps", "100000", "--every", "5", "--sleep", "0.02"]
    command += ["--done-file", str(tmp_path / "done")]
    spec = {"name": "follow", "command": command, "gpus": {"min": 2, "max": 2}, "profile": "learn"}
    job = client.submit(JobSpec.parse({**spec, "batch_size": {"min": 64, "max": 512}}))
    wait_for(
        lambda: (
            (p := job.status().progress) is not None
            and p.metrics.get("follows_batch") == 1
            and "samples_per_s" in p.metrics
        ),
        timeout=90,
        what="a report of its speed that says it follows its batch",
    )
    # When its batch alone is changed, to 256
    changed = client.resize(job.id, 2, batch_size=256)
    assert (changed.state, changed.attempt, changed.batch_size, changed.resize_gpus) == (
        JobState.RUNNING,
        1,
        256,
        None,
    )
    # Then the same attempt, on the same GPUs, goes on at batch 256 from the next checkpoint on
    wait_for(
        lambda: (p := job.status().progress) is not None and p.metrics.get("batch_size") == 256,
        timeout=90,
        what="reports at batch 256",
    )
    logs = job.logs(attempt=1)
    switched = re.search(r"^batch 64 -> 256 in place at step (\d+)$", logs, re.M)
    assert switched, logs[-2000:]
    after = [m for m in re.finditer(r"^step (\d+) loss \S+ \(workers 2, batch (\d+)\)$", logs, re.M)]
    assert {int(m[2]) for m in after if int(m[1]) > int(switched[1])} == {256}
    assert {int(m[2]) for m in after if int(m[1]) <= int(switched[1])} == {64}
    (tmp_path / "done").touch()
    done = job.wait(timeout=60)
    assert (done.state, done.attempt, done.resizes, done.batch_size) == (JobState.SUCCEEDED, 1, 0, 256)
    # And its history says what changed, and fleet learnt its speed at the new batch
    assert [e.reason for e in job.history() if "in place" in e.reason] == [
        "batch 64 -> 256 in place by tester"
    ]
    assert {"2x64", "2x256"} <= done.speeds.keys()
