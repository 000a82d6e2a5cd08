"""Accounting (``fleet history``): jobs that succeed, fail after a requeue and are cancelled, of two
tenants and users, run by the real controller and agent on a manual clock (``memfleet.py``), so the
GPU-hours are exact; then retention deletes the jobs and the API and the CLI still report them."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fleet.bus import CONTROLLER_QUEUE, JobSubmitted
from fleet.errors import Forbidden, JobExpired, SpecError
from fleet.models import JobSpec, JobState
from tests.conftest import Api
from tests.integration.memfleet import MemFleet

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[MemFleet]:
    held = MemFleet(redis_url, tmp_path, {"hist-node1": 4}, retry_backoff_s=30, job_retention_s=60)
    yield held
    held.close()


def submit(fleet: MemFleet, job_id: str, owner: str, tenant: str, script: str, **spec: Any) -> str:
    """Store a job as the API does for ``owner``'s token, and tell the controller."""
    fields = {"name": job_id, "command": ["sh", "-c", script], "tenant": tenant, **spec}
    fleet.jobs.create(job_id, JobSpec.parse(fields), fleet.clock(), owner=owner)
    fleet.bus.send(CONTROLLER_QUEUE, JobSubmitted(job_id=job_id))
    return job_id


def run_three_jobs(fleet: MemFleet) -> None:
    """alice (vision): ``ok`` runs 60 s on 1 GPU and succeeds; ``flaky`` fails after 30 s on 2 GPUs,
    is requeued, runs 30 s more and fails. bob (nlp): ``long`` runs 90 s on 1 GPU, is cancelled."""
    submit(fleet, "ok", "alice", "vision", "sleep 60", gpus=1)
    submit(fleet, "flaky", "alice", "vision", "sleep 30; exit 1", gpus=2, max_attempts=2)
    submit(fleet, "long", "bob", "nlp", "sleep 600", gpus=1)
    fleet.settle()
    assert {fleet.job(j).state for j in ("ok", "flaky", "long")} == {JobState.RUNNING}
    fleet.advance(30)  # flaky's first attempt fails; it waits out its 30 s backoff
    assert (fleet.job("flaky").state, fleet.job("flaky").attempt) == (JobState.QUEUED, 1)
    fleet.advance(30)  # ok succeeds; flaky's second attempt starts
    fleet.advance(30)  # flaky's second attempt fails: FAILED
    fleet.cancel("long")
    fleet.settle()
    states = {j: fleet.job(j).state for j in ("ok", "flaky", "long")}
    assert states == {"ok": JobState.SUCCEEDED, "flaky": JobState.FAILED, "long": JobState.CANCELLED}


def expire_all(fleet: MemFleet) -> None:
    """Let retention (job_retention_s = 60) delete the ended jobs, as the leader does."""
    fleet.advance(61)
    assert fleet.controller.expire() == 3
    for job_id in ("ok", "flaky", "long"):
        with pytest.raises(JobExpired):
            fleet.job(job_id)


def test_history_reports_gpu_hours_per_user_and_job_after_the_jobs_expired(fleet: MemFleet, api: Api) -> None:
    # Given three ended jobs, deleted by retention since
    run_three_jobs(fleet)
    expire_all(fleet)
    until = fleet.clock() + 1  # the manual clock is ahead of the wall clock the API would default to
    admin = api.client()
    # Then per tenant and user, every job is counted, with GPU-seconds over all attempts
    found = admin.usage(since="1h", until=until)
    usage = {(u.tenant, u.user): u for u in found.usage}
    assert set(usage) == {("vision", "alice"), ("nlp", "bob")}
    alice, bob = usage["vision", "alice"], usage["nlp", "bob"]
    assert (alice.jobs, alice.succeeded, alice.failed, alice.cancelled) == (2, 1, 1, 0)
    assert alice.gpu_s == pytest.approx(60 * 1 + (30 + 30) * 2)  # flaky: both attempts, 2 GPUs each
    assert alice.run_s == pytest.approx(60 + 60)
    assert (bob.jobs, bob.cancelled, bob.gpu_s) == (1, 1, pytest.approx(90))
    # And per job, each with its attempts and state
    jobs = {r.id: r for r in admin.usage(since="1h", until=until, by="job").jobs}
    assert {j: (r.state, r.attempts, r.user, r.gpus) for j, r in jobs.items()} == {
        "ok": ("SUCCEEDED", 1, "alice", 1),
        "flaky": ("FAILED", 2, "alice", 2),
        "long": ("CANCELLED", 1, "bob", 1),
    }
    assert jobs["flaky"].gpu_s == pytest.approx(120)
    # And a period that ends before they ended holds none of them
    assert admin.usage(since="1h", until=fleet.clock() - 3600).usage == []


def test_a_user_reads_only_its_own_tenants_history(fleet: MemFleet, api: Api) -> None:
    run_three_jobs(fleet)
    until = fleet.clock() + 1
    bob = api.client(api.token_for("bob", "nlp"))
    # A user of nlp sees nlp's jobs only, whatever it groups by
    assert [(u.tenant, u.user) for u in bob.usage(since="1h", until=until).usage] == [("nlp", "bob")]
    assert [u.tenant for u in bob.usage(since="1h", until=until, by="tenant").usage] == ["nlp"]
    assert [r.id for r in bob.usage(since="1h", until=until, by="job").jobs] == ["long"]
    # And asking for vision's is refused
    with pytest.raises(Forbidden):
        bob.usage(since="1h", until=until, tenant="vision")
    # An admin narrows to one tenant with --tenant
    admin = api.client()
    assert [u.user for u in admin.usage(since="1h", until=until, tenant="vision").usage] == ["alice"]


def test_fleet_history_writes_csv_and_refuses_a_bad_period(fleet: MemFleet, api: Api) -> None:
    run_three_jobs(fleet)
    expire_all(fleet)
    until = datetime.fromtimestamp(fleet.clock() + 1).isoformat()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "fleet", "history", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=api.env())

    # The CSV per tenant parses with the csv module, one line per tenant
    done = cli("--since", "2h", "--until", until, "--by", "tenant", "-o", "csv")
    assert done.returncode == 0, done.stderr
    rows = {r["tenant"]: r for r in csv.DictReader(io.StringIO(done.stdout))}
    assert set(rows) == {"vision", "nlp"}
    assert (rows["vision"]["jobs"], rows["vision"]["succeeded"], rows["vision"]["failed"]) == ("2", "1", "1")
    assert float(rows["vision"]["gpu_hours"]) == pytest.approx(180 / 3600, abs=1e-4)
    assert float(rows["nlp"]["gpu_hours"]) == pytest.approx(90 / 3600, abs=1e-4)
    # And per job, each job a line
    done = cli("--since", "2h", "--until", until, "--by", "job", "-o", "csv")
    assert done.returncode == 0, done.stderr
    assert sorted(r["job"] for r in csv.DictReader(io.StringIO(done.stdout))) == ["flaky", "long", "ok"]
    # A period it cannot read is refused, naming the flag and the forms (exit 2)
    done = cli("--since", "30 days")
    assert done.returncode == 2
    assert "--since '30 days'" in done.stderr and "30d" in done.stderr
    # A user asking for another tenant's history is not allowed (exit 8)
    argv = [sys.executable, "-m", "fleet", "history", "--tenant", "vision"]
    env = api.env(api.token_for("bob", "nlp"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 8, done.stderr


def test_the_leader_trims_accounting_rows_past_their_retention(redis_url: str, tmp_path: Path) -> None:
    held = MemFleet(redis_url, tmp_path, {"hist-node2": 1}, accounting_retention_s=86400)
    try:
        submit(held, "old", "alice", "vision", "sleep 1", gpus=1)
        held.settle()
        held.advance(1)
        assert held.job("old").state == JobState.SUCCEEDED
        accounting = held.controller.expiry.accounting
        assert [r.id for r in accounting.rows(held.clock() - 60, held.clock() + 1)] == ["old"]
        # Two days on, the day it ended is past its retention: its rows go
        held.clock.advance(2 * 86400)
        held.controller.expire()
        assert list(accounting.rows(held.clock() - 3 * 86400, held.clock())) == []
    finally:
        held.close()


def test_a_period_that_ends_before_it_starts_is_refused(api: Api) -> None:
    with pytest.raises(SpecError, match="until"):
        api.client().usage(since=2000.0, until=1000.0)
