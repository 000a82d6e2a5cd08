"""The Slurm habits users bring: hold and release, update a queued job, cancel several (by ids, user,
state), and run a job array's failed tasks again: through the CLI and the Python client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet import Client, JobArray, JobSpec, JobState
from fleet.api.backend import Backend
from fleet.cli.showing import time_limit
from fleet.client import ArrayHandle
from fleet.errors import JobTimeout, SpecError
from fleet.state.control import JobControl, Need
from tests.conftest import Api, FleetProcs
from tests.integration.memfleet import MemFleet
from tests.support import wait_for

pytestmark = pytest.mark.integration
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def cli(api: Api) -> Cli:
    def run(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleet", *args],
            env=api.env(token),
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture
def mem(redis_url: str, tmp_path: Path) -> Iterator[MemFleet]:
    """A controller and an agent of one GPU in memory (``memfleet.py``); the queue's full resync is
    an hour away, so only what a pass reads each time can move a job."""
    fleet = MemFleet(redis_url, tmp_path, {"m-ctl": 1}, controller={"resync_interval_s": 3600})
    yield fleet
    fleet.close()


def spec(*command: str, **fields: object) -> JobSpec:
    return JobSpec.parse({"name": "ctl", "command": list(command), "gpus": 1, **fields})


def state(client: Client, job_id: str) -> JobState:
    return client.get(job_id).state


def test_a_held_job_waits_on_a_free_node_until_released(procs: FleetProcs, client: Client, cli: Cli) -> None:
    # Given one node of one GPU, busy with a job, and a job queued behind it
    procs.one_node(client, "t-hold", gpus=1)
    blocker = client.submit(spec("sleep", "600")).id
    wait_for(lambda: state(client, blocker) == JobState.RUNNING, what="the blocker runs", procs=procs)
    held = client.submit(spec("true")).id

    # When it is held, Then it stays QUEUED and says who holds it
    done = cli("hold", held)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{held} QUEUED: held by tester"
    # And a running job cannot be held (bad input: exit 2, saying what to do)
    running = cli("hold", blocker)
    assert (
        running.returncode == 2
        and f"job {blocker} is RUNNING: only a queued job can be held" in running.stderr
    )
    # And a running job's time limit can be set, and nothing else of it
    limited = cli("update", blocker, "--timeout", "2h")
    assert limited.returncode == 0 and limited.stdout.startswith(f"{blocker} RUNNING"), limited.stderr
    assert "2h00m an attempt" in cli("show", blocker).stdout
    resized = cli("update", blocker, "--gpus", "2")
    assert resized.returncode == 2 and "only its time limit (--timeout) can change" in resized.stderr

    # When the node comes free and a later job (ranked after it) is submitted
    client.cancel(blocker)
    later = client.submit(spec("true"), job_id="ctl-later").id
    wait_for(lambda: state(client, later) == JobState.SUCCEEDED, what="the later job ran", procs=procs)
    # Then the later job ran on the free GPU and the held one is still waiting, held
    job = client.get(held)
    assert job.state == JobState.QUEUED and job.attempt == 0 and job.reason == "held by tester"
    assert any(line.startswith(held) and "held by tester" in line for line in cli("jobs").stdout.splitlines())
    assert json.loads(cli("show", held, "-o", "json").stdout)["held_by"] == "tester"
    # And a final job cannot be held either
    assert cli("hold", later).returncode == 2

    # When it is released, Then it runs
    released = cli("release", held)
    assert released.returncode == 0 and released.stdout.startswith(held), released.stderr
    wait_for(lambda: state(client, held) == JobState.SUCCEEDED, what="the released job ran", procs=procs)
    assert [e.reason for e in client.history(held)][1:3] == ["held by tester", "released by tester"]


def test_update_changes_a_queued_job_as_a_submit_would_check_it(api: Api, client: Client, cli: Cli) -> None:
    # Given three queued jobs (no node: they stay queued)
    first, second, third = (client.submit(spec("true")).id for _ in range(3))
    assert client.position(third).in_tenant == 3

    # When the last one's priority is raised, Then it is first in its tenant's queue
    raised = cli("update", third, "--priority", "5")
    assert raised.returncode == 0, raised.stderr
    assert client.position(third).in_tenant == 1 and client.position(first).in_tenant == 2
    assert client.history(third)[-1].reason == "updated by tester: priority 0 -> 5"
    # When its GPUs and time limit change (from Python), Then its spec says so
    job = client.update(second, gpus=2, timeout="30m")
    assert (job.spec.gpus, job.spec.timeout, job.state) == (2, 1800.0, JobState.QUEUED)

    # And a value a submit would refuse is refused, naming the field
    bad = cli("update", first, "--priority", "5000")
    assert bad.returncode == 2 and "priority" in bad.stderr
    assert cli("update", first).returncode == 2  # nothing to change
    with pytest.raises(SpecError, match="gpus"):
        client.update(first, gpus=-1)
    # And a user may change only its own jobs (exit 8)
    alice = api.token_for("alice", "default")
    assert cli("update", first, "--priority", "1", token=alice).returncode == 8
    assert client.get(first).spec.priority == 0
    # And a job that ended cannot be updated
    client.cancel(first)
    ended = cli("update", first, "--priority", "1")
    assert ended.returncode == 2 and "only a queued job can be updated" in ended.stderr


def test_cancel_several_by_ids_user_and_state_within_the_tenant(api: Api, client: Client, cli: Cli) -> None:
    # Given jobs of tester and of alice in tenant default, and bob of another tenant
    alice, bob = api.token_for("alice", "default"), api.token_for("bob", "elsewhere")
    mine = [client.submit(spec("true")).id for _ in range(3)]
    hers = [api.client(alice).submit(spec("true")).id for _ in range(2)]

    # When two ids and an unknown one are cancelled, Then the two are, and the unknown is named (exit 3)
    several = cli("cancel", mine[0], mine[1], "ctl-nope")
    assert several.returncode == 3 and "'ctl-nope'" in several.stderr
    assert f"{mine[0]} CANCELLED" in several.stdout and several.stdout.rstrip().endswith(
        "cancelled 2 job(s): 2 at once, 0 stopping"
    )
    assert [state(client, j) for j in mine] == [JobState.CANCELLED, JobState.CANCELLED, JobState.QUEUED]

    # When bob cancels every queued job he can, Then nothing of tenant default is touched
    nothing = cli("cancel", "--state", "queued", token=bob)
    assert nothing.returncode == 0 and nothing.stdout.strip() == "no job matched: nothing cancelled"
    # When alice's jobs are cancelled by user, Then only hers are
    report = client.cancel_jobs(user="alice")
    assert sorted(report.cancelled) == sorted(hers) and state(client, mine[2]) == JobState.QUEUED
    # When the queued jobs are cancelled by state, Then the last is, and the count says so
    by_state = cli("cancel", "--state", "QUEUED", "-o", "json")
    assert json.loads(by_state.stdout)["cancelled"] == [mine[2]]
    assert cli("cancel", "--state", "queued").stdout.strip() == "no job matched: nothing cancelled"
    # And a state no job can be cancelled in is a usage error
    assert cli("cancel", "--state", "failed").returncode == 2


def test_requeue_failed_runs_exactly_the_failed_tasks_again(
    procs: FleetProcs, client: Client, cli: Cli, tmp_path: Path
) -> None:
    # Given an array whose odd tasks fail until a file exists
    procs.one_node(client, "t-requeue", gpus=2)
    mark = tmp_path / "fixed"
    script = f"test -e {mark} || [ $((FLEET_ARRAY_INDEX % 2)) -eq 0 ]"
    array = client.submit_array(spec("sh", "-c", script, max_attempts=1), "0-3")
    done = _ended(client, array.id, procs)
    assert done.tasks[JobState.FAILED] == 2 and done.tasks[JobState.SUCCEEDED] == 2
    assert cli("requeue", array.id).returncode == 2  # which tasks: it must be said

    # When the cause is fixed and the failed tasks are requeued
    mark.write_text("")
    requeued = cli("requeue", array.id, "--failed")
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout.splitlines() == [
        f"{array.id}-1 QUEUED",
        f"{array.id}-3 QUEUED",
        f"requeued 2 task(s) of {array.id}; 2 left as they are",
    ]

    # Then exactly those ran again, as their next attempt, and the array ends SUCCEEDED
    done = _ended(client, array.id, procs)
    assert done.tasks[JobState.SUCCEEDED] == 4 and done.failed == []
    attempts = {j.array_index: j.attempt for j in client.jobs(labels={"fleet.array": array.id})}
    assert attempts == {0: 1, 1: 2, 2: 1, 3: 2}
    assert "SUCCEEDED=4" in cli("show", array.id).stdout
    # And nothing is left to requeue (from Python as from the CLI)
    assert client.requeue(array.id).requeued == []
    again = cli("requeue", array.id, "--failed")
    assert again.returncode == 0 and again.stdout.startswith(f"no task of {array.id} to run again")


def test_a_release_whose_message_is_lost_still_lets_the_job_start(mem: MemFleet) -> None:
    # Given a job held in the queue of a free node, as the controller knows it
    control = JobControl(mem.jobs)
    job_id = mem.submit(spec("sleep", "60"))
    held = control.change_queued(job_id, mem.clock(), "held by tester", {"held_by": "tester"}, Need.FREE)
    assert held.applied
    mem.settle()
    assert mem.job(job_id).state == JobState.QUEUED

    # When it is released in state and no message tells the controller
    released = control.change_queued(job_id, mem.clock(), "released by tester", {"held_by": ""}, Need.HELD)
    assert released.applied and mem.bus.deliver() == 0
    mem.settle()

    # Then the controller's next pass read the change all the same: the job runs on the node
    job = mem.job(job_id)
    assert (job.state, job.nodes_held) == (JobState.RUNNING, ["m-ctl"])


def test_hold_and_release_an_array_by_its_id_count_its_queued_tasks(
    api: Api, client: Client, cli: Cli
) -> None:
    # Given an array of four tasks queued (no node), one of them cancelled
    array = client.submit_array(spec("true"), "0-3")
    tasks = [f"{array.id}-{i}" for i in range(4)]
    client.cancel(tasks[3])

    # When the array is held by its id, Then every queued task is, and the count says so
    held = cli("hold", array.id)
    assert held.returncode == 0, held.stderr
    said = f"{array.id}: held 3 task(s); 0 already held, 1 not queued (on nodes or ended)"
    assert held.stdout.strip() == said
    assert [client.get(t).held_by for t in tasks] == ["tester", "tester", "tester", ""]
    assert client.get(tasks[0]).reason == "held by tester"

    # When one task is released alone, then the array, Then the others are, counted
    assert cli("release", tasks[0]).returncode == 0
    released = cli("release", array.id, "-o", "json")
    assert released.returncode == 0, released.stderr
    assert json.loads(released.stdout) == {"changed": 2, "already": 1, "not_queued": 1}
    assert [client.get(t).held_by for t in tasks[:3]] == ["", "", ""]
    # And from Python as from the CLI
    assert client.hold_array(array.id).changed == 3

    # And an id that is neither a job nor an array is no such job (exit 3)
    nothing = cli("hold", "ctl-nothing")
    assert nothing.returncode == 3 and "ctl-nothing" in nothing.stderr
    # And another user of the tenant may not release tester's array (exit 8): its tasks stay held
    alice = cli("release", array.id, token=api.token_for("alice", "default"))
    assert alice.returncode == 8 and f"job array {array.id}" in alice.stderr
    assert [client.get(t).held_by for t in tasks[:3]] == ["tester", "tester", "tester"]


def test_a_running_jobs_time_limit_can_be_raised_and_its_node_keeps_the_new_one(mem: MemFleet) -> None:
    # Given a job of a 1-minute limit running on the node for 30 s
    backend = Backend(settings=mem.settings)
    job_id = mem.submit(spec("sleep", "600", timeout="1m"))
    mem.settle()
    mem.advance(30)
    assert mem.job(job_id).state == JobState.RUNNING

    # When its limit is raised to 3 minutes
    job = backend.update(job_id, {"timeout": "3m"}, "tester")
    assert (job.state, job.spec.timeout) == (JobState.RUNNING, 180.0)
    assert time_limit(job, mem.clock()) == "3m00s an attempt, 2m30s left"
    assert mem.jobs.history(job_id)[-1].reason == "updated by tester: timeout 60 -> 180"

    # Then it runs past its old limit, and is stopped at the new one
    mem.advance(60)
    assert mem.job(job_id).state == JobState.RUNNING
    mem.advance(91)
    job = mem.job(job_id)
    assert job.state == JobState.FAILED and job.reason.startswith("time limit of 180s reached")
    # And a job on a node may change nothing else (exit 2, saying what it may)
    running = mem.submit(spec("sleep", "600"))
    mem.settle()
    with pytest.raises(SpecError, match=r"only its time limit \(--timeout\) can change on a node"):
        backend.update(running, {"priority": 5}, "tester")
    backend.close()


def test_the_changed_jobs_feed_says_when_the_leader_must_read_its_whole_queue(redis_url: str) -> None:
    # Given a job held, as the leader last looked at the feed before it
    backend = Backend(redis_url)
    jobs = backend.stores.jobs
    single = backend.submit(spec("true")).id
    _, before, _ = jobs.changed_since(0)
    backend.hold(single, "tester")
    # Then the feed names it, and nothing else, since that look
    assert jobs.changed_since(before) == ([single], before + 1, False)
    assert jobs.changed_since(before + 1) == ([], before + 1, False)

    # When more jobs change than the feed keeps (every task of a 10,001-task array held)
    array = backend.submit_array(spec("true"), "0-10000")
    assert backend.hold_array(array.id, "tester").changed == 10_001
    # Then a leader that looked before them is told it missed some: it reads its whole queue again
    names, now, missed = jobs.changed_since(before + 1)
    assert missed and now == before + 10_002 and len(names) == 10_000
    # And one that looked lately still gets just what changed since
    assert jobs.changed_since(now - 2) == ([f"{array.id}-9999", f"{array.id}-10000"], now, False)
    backend.close()


def _ended(client: Client, array_id: str, procs: FleetProcs) -> JobArray:
    """The array once every task is final (within the suite's per-test timeout, with the services'
    logs when not)."""
    try:
        return ArrayHandle(client, array_id).wait(60)
    except JobTimeout:
        pytest.fail(f"array {array_id} did not end in 60 s:\n{procs.logs()}")
