"""An elastic job's scaling profile, the two kinds not bundled with fleet: a user's own directory in
the profiles format (uploaded by the Client), and one learned live from the job's own reports.

Real API, controller and agent processes on simulated GPUs, the process runtime. The learning jobs
report a throughput the test chooses for each GPU count, so what the controller learns is known.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import fleet
from fleet import Client, JobSpec, JobState
from fleet.client import JobHandle
from fleet.errors import SpecError
from tests.conftest import Api, FleetProcs
from tests.support import wait_for

pytestmark = pytest.mark.integration
BUNDLED = Path(fleet.__file__).parent / "traces" / "profiles"
#: reports samples/s = RATES[FLEET_NUM_GPUS] every 0.1 s; checkpoints (nothing) and leaves on SIGTERM
REPORTER = """
import json, os, sys, time
import fleet_worker as fw
rates, done = json.loads(sys.argv[1]), sys.argv[2]
rate = rates[os.environ["FLEET_NUM_GPUS"]]
stop = fw.stop_requested()
print(f"running at {os.environ['FLEET_NUM_GPUS']} GPUs, batch {os.environ['FLEET_BATCH_SIZE']}", flush=True)
while not os.path.exists(done):
    time.sleep(0.1)
    fw.report(samples=round(rate * 0.1))
    if stop.is_set():
        fw.exit_after_checkpoint()
"""


@pytest.fixture
def runtime() -> str:
    return "process"


def elastic(profile: str, **fields: object) -> JobSpec:
    spec = {
        "name": "elastic",
        "command": ["sleep", "600"],
        "gpus": {"min": 1, "max": 4},
        "batch_size": {"min": 128, "max": 1024},
        "profile": profile,
        **fields,
    }
    return JobSpec.parse(spec)


def test_a_users_profile_directory_is_uploaded_and_sizes_the_job(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    # Given a fleet of one 4-GPU node, and a user's own profile: cifar10's measurements without the
    # batch sizes above 256 (its batch range is what its validation-<B>.csv files say)
    procs.one_node(client, "p-a", gpus=4)
    mine = tmp_path / "my-model"
    shutil.copytree(BUNDLED / "cifar10", mine)
    for big in ("512", "1024", "2048", "4096"):
        (mine / f"validation-{big}.csv").unlink()
    # When a job names the directory: the Client uploads it and the spec carries its digest
    job = client.submit(elastic(f"{mine}/"))
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", job.status().spec.profile or "")
    # Then the controller sizes it by that profile: alone on the node it takes all 4 GPUs, at a batch
    # within the directory's range (128-256), not the bundled profile's (up to 4096)
    wait_for(lambda: job.status().state == JobState.RUNNING, what="the job running")
    status = job.status()
    assert status.num_gpus == 4 and 128 <= status.batch_size <= 256, status
    # And the same directory again is the same profile (uploaded once, by content)
    assert client.submit(elastic(str(mine))).status().spec.profile == status.spec.profile


def test_a_profile_that_is_not_one_is_refused_at_submit_naming_what_is_wrong(
    client: Client, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecError, match=r"profile .*/empty: no placements.csv there"):
        client.submit(elastic(str(empty)))
    broken = tmp_path / "broken"
    shutil.copytree(BUNDLED / "ncf", broken)
    (broken / "placements.csv").write_text("placement,local_bsz\n1,32\n")
    with pytest.raises(SpecError, match=r"profile .*/broken: not in the profiles format: 'step_time'"):
        client.submit(elastic(str(broken)))
    with pytest.raises(SpecError, match=r"profile sha256:0{64}: not uploaded \(or expired\)"):
        client.submit(elastic("sha256:" + "0" * 64))
    with pytest.raises(SpecError, match=r"profile: an elastic job needs a scaling profile \(got 'resnet'\)"):
        client.submit(elastic("resnet"))
    assert client.listing() == []  # nothing was queued


def reporter(tmp_path: Path, rates: dict[int, float], name: str) -> JobSpec:
    done = tmp_path / f"{name}.done"
    command = [
        sys.executable,
        "-c",
        REPORTER,
        str({str(g): r for g, r in rates.items()}).replace("'", '"'),
        str(done),
    ]
    return elastic("learn", name=name, command=command, batch_size={"min": 64, "max": 4096})


def sizes_run(job: JobHandle) -> list[tuple[int, int]]:
    """(GPUs, batch) each attempt ran at, from its first line."""
    found = []
    for attempt in range(1, job.status().attempt + 1):
        m = re.search(r"running at (\d+) GPUs, batch (\d+)", job.logs(attempt=attempt))
        if m:
            found.append((int(m[1]), int(m[2])))
    return found


def test_a_learned_profile_grows_a_job_that_scales_and_shrinks_one_that_does_not(
    procs: FleetProcs, client: Client, api: Api, tmp_path: Path
) -> None:
    # Given two 4-GPU nodes and a controller that resizes at most every 2 s, reading jobs every second
    procs.env.update(FLEET_CONTROLLER__ELASTIC_MIN_INTERVAL_S="2", FLEET_CONTROLLER__RESIZE_COST_S="0.5")
    procs.env.update(FLEET_CONTROLLER__ELASTIC_INTERVAL_S="0.5", FLEET_CONTROLLER__RESYNC_INTERVAL_S="1")
    procs.controller()
    procs.agent("l-a", gpus=4)
    procs.agent("l-b", gpus=4)
    procs.wait_nodes(client, 2)
    # When two jobs with `profile: learn` run, one twice as fast on twice the GPUs, one slower (a job
    # bound by communication; a merely flat one could look faster on a busy 2-core test machine)
    scales = client.submit(reporter(tmp_path, {1: 100, 2: 200, 4: 400}, "scales"))
    flat = client.submit(reporter(tmp_path, {1: 100, 2: 50, 4: 25}, "flat"))
    # Then each starts at 1 GPU and batch 64 (nothing known yet), and is tried at twice that once
    # it has reported; the one that scales keeps growing, to 4 GPUs (its batch per GPU kept)
    wait_for(lambda: len(sizes_run(scales)) >= 3, timeout=90, what="the scaling job's third attempt")
    assert sizes_run(scales)[:3] == [(1, 64), (2, 128), (4, 256)], (scales.history(), procs.logs())
    # And the one that was slower on 2 GPUs goes back to 1
    wait_for(lambda: len(sizes_run(flat)) >= 3, timeout=90, what="the flat job's third attempt")
    assert sizes_run(flat)[:3] == [(1, 64), (2, 128), (1, 64)], flat.history()
    # And what was learned is on the job: samples/s at each size it ran at
    speeds = scales.status().speeds
    assert speeds["1x64"] == pytest.approx(100, rel=0.3) and speeds["2x128"] == pytest.approx(200, rel=0.3)
    shown = subprocess.run(
        [sys.executable, "-m", "fleet", "show", scales.id],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert re.search(r"Samples/s: +1 GPU x 64: [0-9.]+/s, 2 GPUs x 128: [0-9.]+/s", shown), shown
    page = urllib.request.Request(
        f"{api.url}/ui/jobs/{scales.id}", headers={"Authorization": f"Bearer {api.token}"}
    )
    with urllib.request.urlopen(page, timeout=30) as response:
        assert re.search(r'id="job-speeds">1x64: [0-9.]+/s · 2x128: [0-9.]+/s', response.read().decode())
    for name in ("scales", "flat"):
        (tmp_path / f"{name}.done").touch()
    for job in (scales, flat):
        status = job.wait(timeout=60)
        assert (status.state, status.failures) == (JobState.SUCCEEDED, 0), job.history()
