"""The Python API as a program uses it: handles like futures, waiting on many, filters."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest

import fleet
from fleet import Client, JobCancelled, JobFailed, JobSpec, JobState, NodeState, SpecError
from fleet.errors import Forbidden
from tests.conftest import Api, FleetProcs
from tests.support import sh, until

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def ready(procs: FleetProcs, client: Client) -> Client:
    procs.one_node(client, "t-py", gpus=2)
    return client


def test_handles_behave_like_futures(ready: Client) -> None:
    ok = ready.submit(sh("ok", "echo one; sleep 0.5; echo two"))
    bad = ready.submit(sh("bad", "exit 4"))
    slow = ready.submit(sh("slow", "sleep 600"))
    # result() gives the final status of a success, and raises with it for a failure
    assert ok.result(timeout=60).state == JobState.SUCCEEDED and ok.done()
    with pytest.raises(JobFailed, match=r"job bad-\w+ FAILED: exited with code 4") as failed:
        bad.result(timeout=60)
    assert failed.value.job.exit_code == 4 and failed.value.exit_code == 1
    # a job still running is not done, and a cancelled one raises JobCancelled
    assert not slow.done()
    slow.cancel()
    with pytest.raises(JobCancelled):
        slow.result(timeout=60)
    # and the logs come as an iterator of lines that ends with the attempt
    assert list(ok.follow_logs()) == ["one", "two"]


def test_wait_and_as_completed_over_many_jobs(ready: Client) -> None:
    quick, later = ready.submit(sh("quick", "true")), ready.submit(sh("later", "sleep 3"))
    done, pending = fleet.wait([quick, later], timeout=60, return_when=fleet.FIRST_COMPLETED)
    assert done == {quick} and pending == {later}
    assert [h.id for h in fleet.as_completed([later, quick], timeout=60)][-1] == later.id
    done, pending = fleet.wait([quick, later], timeout=60)
    assert (done, pending) == ({quick, later}, set())
    with pytest.raises(SpecError, match="return_when"):
        fleet.wait([quick], return_when="SOMETIME")


def test_listing_filters_by_state_user_and_label(api: Api) -> None:
    with api.client(api.token_for("ann", "t")) as ann, api.client(api.token_for("bob", "t")) as bob:
        mine = ann.submit(sh("a", "true", labels={"exp": "7"}))
        bob.submit(sh("b", "true", labels={"exp": "8"}))
        assert [j.id for j in ann.jobs(state="queued", labels={"exp": "7"})] == [mine.id]
        assert [j.id for j in bob.jobs(user="ann")] == [mine.id]
        assert {j.owner for j in ann.listing()} == {"ann", "bob"}  # same tenant: both visible
        with pytest.raises(SpecError, match="state 'runing': expected one of QUEUED"):
            ann.jobs(state="runing")
        cli = subprocess.run(
            [sys.executable, "-m", "fleet", "jobs", "--label", "exp=8", "-o", "json"],
            env=api.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert [j["owner"] for j in json.loads(cli.stdout)] == ["bob"]


def test_nodes_node_shows_one_node(ready: Client, procs: FleetProcs) -> None:
    for argv in (["nodes", "t-py"], ["nodes", "show", "t-py"]):
        done = subprocess.run(
            [sys.executable, "-m", "fleet", *argv, "-o", "json"],
            env=procs.cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(done.stdout)["name"] == "t-py", done.stderr


def test_versions_name_the_release_of_each_service(ready: Client) -> None:
    # Given a fleet whose API, controller and agent run this release
    until(lambda: ready.versions().controller, "the controller leading")
    versions = ready.versions()
    # Then each is named, and the fleet is not mixed; every answer named the API's release
    assert (versions.api, versions.controller, versions.nodes, versions.mixed) == (
        fleet.__version__,
        fleet.__version__,
        {"t-py": fleet.__version__},
        "",
    )
    assert ready.server_version == fleet.__version__ and ready.node("t-py").version == fleet.__version__


def report(step: int, total: int, loss: float) -> str:
    return f"""echo 'fleet-progress {{"step": {step}, "total": {total}, "loss": {loss}}}'"""


def test_progress_is_the_current_attempts_last_report(ready: Client, procs: FleetProcs) -> None:
    # Given a job whose first attempt reports progress and fails, and whose second reports later
    script = (
        f'if [ "$FLEET_ATTEMPT" = 1 ]; then {report(1, 4, 0.9)}; {report(2, 4, 0.5)}; exit 1; fi; '
        f"sleep 1.5; {report(3, 4, 0.25)}; sleep 600"
    )
    job = ready.submit(sh("prog", script, max_attempts=2))
    # Then while the second attempt has not reported yet, the job shows no progress (not the first's)
    until(lambda: job.status().attempt == 2 and job.status().state == JobState.RUNNING, "attempt 2 running")
    assert job.progress() is None
    # And once it reports, the job's progress is that last report
    found = until(lambda: job.progress(), "attempt 2's report")
    assert (found.step, found.total, found.metrics, found.fraction) == (3, 4, {"loss": 0.25}, 0.75)
    # And `fleet jobs` shows it as a percentage, `fleet show` as a bar
    listing = cli(procs, "jobs").splitlines()
    column = listing[0].split().index("PROGRESS")
    assert next(line.split() for line in listing if line.startswith(job.id))[column] == "75%"
    shown = next(line for line in cli(procs, "show", job.id).splitlines() if line.startswith("Progress"))
    assert "75%" in shown and "#" in shown, shown
    job.cancel()


def test_logs_follow_draws_progress_lines_as_a_bar(ready: Client, procs: FleetProcs) -> None:
    job = ready.submit(sh("bar", f"echo start; {report(1, 2, 0.5)}; echo done"))
    job.result(timeout=60)
    followed = cli(procs, "logs", "-f", job.id).splitlines()
    assert followed[0] == "start" and followed[2] == "done"
    assert followed[1].startswith("progress [") and "50% step 1/2 loss=0.5" in followed[1], followed
    # and the plain log keeps the line as the job printed it
    assert job.logs().splitlines()[1].startswith('fleet-progress {"step": 1')


def cli(procs: FleetProcs, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fleet", *argv],
        env=procs.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_job_method_of_the_client(ready: Client, tmp_path: Path) -> None:
    # submit with an id is idempotent; get, job, jobs and listing find it
    first = ready.submit(sh("ided", "echo hi"), job_id="my-run-1")
    assert ready.submit(sh("ided", "echo hi"), job_id="my-run-1") == first and first.id == "my-run-1"
    assert ready.wait(first.id, timeout=60).state == JobState.SUCCEEDED
    assert ready.get(first.id).exit_code == 0 and ready.job(first.id) == first
    assert first.id in [j.id for j in ready.jobs()] and first.id in [j.id for j in ready.listing()]
    assert [line.line for line in ready.logs(first.id)] == ["hi"]
    assert [line.line for line in ready.follow_logs(first.id, attempt=1)] == ["hi"]
    assert [e.state for e in ready.history(first.id)][-1] == "SUCCEEDED" == first.history()[-1].state
    # a job too big for the node waits, with its place in the queue; cancel ends it
    big = ready.submit(sh("big", "true", gpus=3, labels={"exp": "big"}, allow_unplaceable=True))
    place = until(lambda: ready.position(big.id), "a queue position")
    assert (place.in_tenant, place.tenant, ready.most_gpus()) == (1, "default", 2)
    assert ready.cancel_labels({"exp": "big"}).cancelled == [big.id]
    assert ready.position(big.id) is None and ready.cancel(big.id).state == JobState.CANCELLED
    # a shipped directory: uploaded once, named by digest, the job's working directory
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "hello.txt").write_text("shipped\n")
    digest = ready.upload_workdir(str(tmp_path / "proj"))
    assert digest.startswith("sha256:") and ready.upload_workdir(str(tmp_path / "proj")) == digest
    steps: list[str] = []
    told = ready.ship_workdir(str(tmp_path / "proj"), lambda step, done, total: steps.append(step))
    assert (told.digest, told.files, told.size, told.uploaded) == (digest, 1, 8, False)
    by_digest = ready.submit(sh("wd", "cat hello.txt", workdir=digest))
    by_digest.result(timeout=60)
    assert list(by_digest.logs(follow=True)) == ["shipped"]
    shipped = ready.submit(sh("wd", "cat hello.txt", workdir=str(tmp_path / "proj")))
    assert shipped.result(timeout=60).state == JobState.SUCCEEDED and shipped.logs() == "shipped"
    # a scaling profile of one's own (the profiles format): uploaded once, named by digest
    mine = shutil.copytree(Path(fleet.__file__).parent / "traces" / "profiles" / "bert", tmp_path / "bert")
    profile = ready.upload_profile(str(mine))
    assert profile.startswith("sha256:") and ready.upload_profile(str(mine)) == profile
    elastic = ready.submit(sh("el", "true", gpus={"min": 1, "max": 2}, batch_size=12, profile=profile))
    assert elastic.status().spec.profile == profile and elastic.result(timeout=60).state == JobState.SUCCEEDED
    assert ready.quarantined_jobs() == {}


def test_submit_many_queues_a_batch_all_or_nothing(ready: Client, tmp_path: Path) -> None:
    # Given five jobs submitted in one call, two shipping the same directory
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "hello.txt").write_text("shipped\n")
    specs = [sh(f"b{i}", f"echo {i}") for i in range(3)]
    specs += [sh("wd", "cat hello.txt", workdir=str(tmp_path / "proj")) for _ in range(2)]
    handles = ready.submit_many(specs)
    # Then each runs, in the order given, as the job it was
    assert [h.result(timeout=60).state for h in handles] == [JobState.SUCCEEDED] * 5
    assert [h.logs() for h in handles] == ["0", "1", "2", "shipped", "shipped"]
    assert len({h.id for h in handles}) == 5 and all(h.status().owner == "tester" for h in handles)
    # And a batch given after= waits for those jobs, each of its jobs
    later = ready.submit_many([sh("l0", "true"), sh("l1", "true")], after=[handles[0]])
    assert [[d.job for d in h.status().spec.after] for h in later] == [[handles[0].id]] * 2
    # And with ids given a repeated batch queues nothing more
    ided = ready.submit_many([sh("c", "true"), sh("d", "true")], job_ids=["batch-c", "batch-d"])
    assert [h.id for h in ided] == ["batch-c", "batch-d"]
    assert ready.submit_many([sh("c", "true"), sh("d", "true")], job_ids=["batch-c", "batch-d"]) == ided
    queued = len(ready.jobs())
    # When any spec of a batch is refused, none is queued, and the error names its index and field
    bad = [sh("e", "true"), {"name": "f", "command": ["x"], "gpus": -1}]
    with pytest.raises(SpecError, match=r"jobs\[1\]: invalid job spec:\s+gpus: "):
        ready.submit_many(bad)
    with pytest.raises(SpecError, match=r"jobs\[1\]: job id 'batch-c' already exists with a different spec"):
        ready.submit_many([sh("g", "true"), sh("c", "false")], job_ids=["batch-g", "batch-c"])
    with pytest.raises(SpecError, match=r"jobs\[1\]: id 'same' is also jobs\[0\]'s"):
        ready.submit_many([sh("h", "true"), sh("i", "true")], job_ids=["same", "same"])
    with pytest.raises(SpecError, match=r"jobs\[0\]: job id 'a/b' is invalid"):
        ready.submit_many([sh("h", "true")], job_ids=["a/b"])
    with pytest.raises(SpecError, match="1001 specs; give 1 to 1000 a call"):
        ready.submit_many([sh("j", "true")] * 1001)
    assert len(ready.jobs()) == queued and "batch-g" not in [j.id for j in ready.jobs()]


def test_arrays_through_their_handles(ready: Client) -> None:
    done = ready.submit_array(sh("arr", 'echo "task $FLEET_ARRAY_INDEX"'), "0-2", max_running=2)
    assert done.wait(timeout=60).tasks[JobState.SUCCEEDED] == 3
    assert done.task(1).result(timeout=10).state == JobState.SUCCEEDED and done.task(1).logs() == "task 1"
    assert ready.array(done.id).size == 3 == done.status().size
    waiting = ready.submit_array(sh("arr", "true", gpus=3, allow_unplaceable=True), [0, 1])
    assert sorted(waiting.cancel().cancelled) == [f"{waiting.id}-0", f"{waiting.id}-1"]
    assert ready.cancel_array(waiting.id).already_final == 2


def test_hold_update_release_cancel_several_requeue_and_usage(ready: Client, tmp_path: Path) -> None:
    # Given both GPUs busy and a job queued behind them, held and raised in priority
    busy = ready.submit(sh("busy", "sleep 600", gpus=2))
    until(lambda: busy.status().state == JobState.RUNNING, "the busy job runs", 60)
    queued = ready.submit(sh("queued", "echo ran", gpus=1))
    assert ready.hold(queued.id).held_by and ready.update(queued.id, priority=5).spec.priority == 5
    # When the busy job is cancelled by id: the held job waits, saying who holds it
    assert ready.cancel_jobs([busy.id]).stopping == [busy.id]  # running: its agent stops it
    assert busy.wait(timeout=60).state == JobState.CANCELLED
    assert queued.status().state == JobState.QUEUED and queued.status().held_by
    # Then released, it runs
    assert not ready.release(queued.id).held_by
    assert queued.wait(timeout=60).state == JobState.SUCCEEDED
    # And an array's failed task runs again under its id once its cause is fixed
    mark = tmp_path / "fixed"
    array = ready.submit_array(sh("rq", f"test -e {mark} || [ $FLEET_ARRAY_INDEX -eq 0 ]"), "0-1")
    assert array.wait(timeout=60).tasks[JobState.FAILED] == 1
    mark.write_text("")
    assert ready.requeue(array.id).requeued == [f"{array.id}-1"]
    assert array.wait(timeout=60).tasks[JobState.SUCCEEDED] == 2
    # And the accounting counts every job that ended; a download path outside the job is refused
    counted = {r.id for r in ready.usage(since="1h", by="job").jobs}
    assert {busy.id, queued.id, f"{array.id}-1"} <= counted
    with pytest.raises(SpecError, match="path"):
        ready.download(queued.id, "../etc", tmp_path / "out")
    with pytest.raises(SpecError, match="path"):
        queued.download("/etc", tmp_path / "out")


def test_nodes_tenants_tokens_and_webhook_methods(ready: Client, api: Api) -> None:
    assert [n.name for n in ready.nodes()] == ["t-py"] and ready.node("t-py").alive
    assert ready.cordon("t-py", reason="check").admin_state == NodeState.CORDONED
    assert ready.uncordon("t-py").admin_state == NodeState.READY
    assert ready.drain("t-py", deadline_s=0, force=True)[0].admin_state == NodeState.DRAINING
    assert ready.wait_drained(["t-py"], timeout=30)[0].admin_state == NodeState.DRAINED
    ready.uncordon("t-py")
    assert ready.quarantined_nodes() == {}
    # the fleet's one Redis (the session's), as an operator sees it: primary, nothing replicating it
    redis_status = ready.redis_status()
    seen = (redis_status.primary, redis_status.replicas, redis_status.failovers, redis_status.error)
    assert seen == (f"127.0.0.1:{urlparse(api.redis_url).port}", [], 0, ""), redis_status
    # tenants: set, listed with their standing (deleted below, once a token and webhook used it)
    assert ready.set_tenant("ml", guaranteed_gpus=1, webhook="https://hooks.example/x").webhook is not None
    assert "ml" in [t.tenant.name for t in ready.tenants()]
    # tokens: whoami, made, listed, revoked
    assert ready.whoami().role == "admin"
    token, info = ready.create_token("ann", "ml", "user", expires_in_s=3600)
    with Client(api.url, token) as ann:
        assert ann.whoami().user == "ann"
        # webhooks: a user reads its own tenant's secret, not another's
        assert ann.webhook_secret().startswith("whsec_") and ann.webhook_deliveries() == []
        with pytest.raises(Forbidden, match="reads its own tenant's"):
            ann.webhook_secret("default")
    assert info.id in [t.id for t in ready.tokens()] and ready.revoke_token(info.id).user == "ann"
    before = ready.webhook_secret("ml")
    assert ready.rotate_webhook_secret("ml") != before and ready.webhook_secret("ml") != before
    assert ready.delete_tenant("ml").guaranteed_gpus == 1
    ready.close()  # closes this thread's connection; the next call opens another
    assert ready.whoami().user == "tester"


def test_a_blob_is_uploaded_by_its_digest(client: Client) -> None:
    # Given bytes a job takes along (a function's call is sent so), when they are uploaded twice
    data = b"arguments of a call"
    digest = client.upload_blob(data)
    # Then both name them by their SHA-256, and the fleet holds them
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest() == client.upload_blob(data)
    assert client._holds(digest) and not client._holds("sha256:" + hashlib.sha256(b"other").hexdigest())


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda c: c.jobs(state="runing"), "state 'runing': expected one of QUEUED"),
        (lambda c: c.jobs(limit=0), "limit 0: expected a whole number from 1"),
        (lambda c: c.jobs(labels={"exp": 7}), "labels .*expected a dict of strings"),
        (lambda c: c.get(""), "job id '': expected a non-empty string"),
        (lambda c: c.wait("x", timeout=-1), "timeout -1: expected seconds as a number >= 0"),
        (lambda c: c.wait("x", timeout="10"), "timeout '10': expected seconds"),
        (lambda c: c.logs("x", attempt=0), "attempt 0: expected a whole number from 1"),
        (lambda c: c.submit("python train.py"), "spec 'python train.py': expected a JobSpec"),
        (lambda c: c.submit({"name": "j", "command": ["x"], "gpu": 1}), "did you mean 'gpus'"),
        (lambda c: c.submit(sh("j", "x"), job_id="a/b"), "job id 'a/b' is invalid"),
        (lambda c: c.drain([]), "expected a node name or a list of node names"),
        (lambda c: c.set_tenant("t", gpus=1), "gpus: unknown field; allowed fields"),
        (lambda c: c.create_token("u", "t", role="root"), "role 'root': expected one of user"),
        (lambda c: fleet.wait([], timeout=-5), "timeout -5"),
        (lambda c: c.submit_array(sh("a", "x"), 10), "indices 10: expected a range like '0-9999'"),
        (lambda c: fleet.ArrayHandle(c, "a").task(-1), "index -1: expected a whole number from 0"),
        (lambda c: JobSpec(name="j", command=["x"], gpu=1), "gpu: unknown field.*did you mean 'gpus'"),
    ],
)
def test_a_bad_argument_is_a_spec_error_with_the_fix(
    client: Client, call: Callable[[Client], object], said: str
) -> None:
    with pytest.raises(SpecError, match=said):
        call(client)


def test_every_public_method_has_a_test() -> None:
    """A method added to the Python API without a test here (or in the async module) fails this."""
    from fleet import aio, handles

    here = "".join(
        (Path(__file__).parent / name).read_text()
        for name in (
            "test_python_api.py",
            "test_python_api_async.py",
            "test_functions.py",
            "test_function_map.py",
        )
    )
    classes = [
        Client,
        handles.JobHandle,
        handles.ArrayHandle,
        aio.AsyncClient,
        aio.AsyncJobHandle,
        aio.AsyncArrayHandle,
        fleet.Function,
        fleet.FunctionHandle,
        fleet.Executor,
    ]
    public = {
        name
        for cls in classes
        for name, member in vars(cls).items()
        if not name.startswith("_") and not isinstance(member, property)
    }
    untested = sorted(name for name in public if f".{name}(" not in here)
    assert untested == []
    assert (
        "fleet.wait(" in here
        and "fleet.as_completed(" in here
        and "aio.wait(" in here
        and "aio.as_completed(" in here
    )
