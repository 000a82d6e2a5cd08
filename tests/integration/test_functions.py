"""Functions on the fleet (``@fleet.function``): a call runs as a job on a node, as the tenant's
unprivileged user, and ``result()`` brings back what it returned or raised."""

from __future__ import annotations

import importlib
import json
import math
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from redis import Redis

import fleet
from fleet import Client, JobCancelled, JobFailed, JobSpec, JobState, SpecError
from fleet.errors import JobExpired
from fleet.keys import Keys
from fleet.outputs import kept_dir
from tests.conftest import Api, FleetProcs, need, need_torch
from tests.support import start_api, wait_for

pytestmark = pytest.mark.integration
#: fleet's default job image: fleet_worker and cloudpickle, no fleet (make images-test)
PYTHON_IMAGE = "localhost/fleet/python:latest"

#: a user's module, shipped with its calls (``workdir``): the node imports it from there
CALC = """
import os
import sys
import time

import fleet
import fleet_worker as fw

HERE = os.path.dirname(os.path.abspath(__file__))
ON_FLEET = fleet.function(python=sys.executable, workdir=HERE, gpus=1)


class Overdrawn(ValueError):
    pass


@ON_FLEET
def squares(n, offset=0):
    return {"sum": sum(i * i for i in range(n)) + offset, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "uid": os.getuid()}


@ON_FLEET
def withdraw(balance, amount):
    if amount > balance:
        raise Overdrawn(f"{amount} is more than {balance}")
    return balance - amount


@ON_FLEET
def gather(*parts, **named):
    return {"parts": parts, "named": named}


@ON_FLEET
def nap(seconds):
    time.sleep(seconds)
    return "rested"


@ON_FLEET
def tensor_squares(n):
    import torch

    return torch.arange(n) ** 2, torch.__version__


@ON_FLEET
def count_to(n, pause):
    found = fw.load_latest()
    state = found[0] if found else {"next": 0, "total": 0}
    resumed_from = state["next"]
    for i in range(state["next"], n):
        state = {"next": i + 1, "total": state["total"] + i}
        fw.save(state, i + 1)
        print(f"step {i + 1}", flush=True)
        time.sleep(pause)
    return {"total": state["total"], "resumed_from": resumed_from, "attempt": fw.attempt()}
"""


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def calc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The user's module, imported here from its project directory, as a script of theirs would."""
    project = tmp_path / "project"
    project.mkdir(mode=0o755)
    (project / "calc.py").write_text(textwrap.dedent(CALC))
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(sys.modules, "calc", raising=False)
    yield importlib.import_module("calc")
    sys.modules.pop("calc", None)


@pytest.fixture
def ready(procs: FleetProcs, api: Api, storage_api: tuple[str, Path]) -> Client:
    """A fleet of one node, and a client of the API that reads its checkpoint storage (a call's
    outcome is kept there with the job's outputs), shared by the module's fleets."""
    url, storage = storage_api
    procs.share_checkpoints(storage)
    procs.controller()
    procs.agent("t-fn", gpus=2)
    client = Client(url, api.token)
    api.clients.append(client)
    procs.wait_nodes(client, 1)
    return client


def test_a_function_returns_what_it_computed_on_the_node(
    procs: FleetProcs, ready: Client, calc: ModuleType
) -> None:
    # Given a module-level function decorated with @fleet.function, which still runs here as it was
    here = calc.squares(4)
    assert here["sum"] == 14
    # When it is submitted with arguments
    handle = calc.squares.on(ready).submit(100, offset=1)
    # Then result() is its return value, computed in a job on the node, on the GPU it was given,
    # as the tenant's user, not this process's
    value = handle.result(timeout=120)
    assert value["sum"] == sum(i * i for i in range(100)) + 1
    assert value["gpus"].startswith("GPU-") and "," not in value["gpus"]  # the one GPU it asked for
    if "FLEET_AGENT__JOB_USER" not in procs.env:  # jobs run as root where this Python is private
        assert value["uid"] not in (0, here["uid"])
    assert handle.done() and handle.status().state == JobState.SUCCEEDED
    # And the job says which function it ran and with what
    call = handle.status().spec.call
    assert call is not None and (call.function, call.args) == ("calc.squares", "100, offset=1")


def test_a_function_returns_a_torch_tensor_computed_on_the_node(ready: Client, calc: ModuleType) -> None:
    need_torch()
    import torch

    # Given a function computing a tensor, when it runs on the fleet
    value, version = calc.tensor_squares.on(ready).submit(6).result(timeout=120)
    # Then the caller holds that tensor, made by the node's torch
    assert torch.equal(value, torch.tensor([0, 1, 4, 9, 16, 25])) and version == torch.__version__


def test_an_exception_is_raised_again_with_the_remote_traceback(ready: Client, calc: ModuleType) -> None:
    # Given a function that raises its own exception for some arguments
    handle = calc.withdraw.on(ready).submit(10, 25)
    # When its result is asked for
    with pytest.raises(calc.Overdrawn, match="25 is more than 10") as raised:
        handle.result(timeout=120)
    # Then it is the function's own exception, not a fleet error, with the node's traceback attached
    notes = "\n".join(raised.value.__notes__)
    assert "raised on the fleet" in notes
    assert 'raise Overdrawn(f"{amount} is more than {balance}")' in notes and "calc.py" in notes
    # And the job ended FAILED after one attempt (a function's exception is not retried by default)
    assert (handle.status().state, handle.status().attempt) == (JobState.FAILED, 1)


def test_a_time_limit_or_a_cancel_is_a_fleet_error_not_the_functions(ready: Client, calc: ModuleType) -> None:
    # Given a call stopped by its time limit, and one cancelled while it runs
    limited = calc.nap.on(ready).options(timeout="1s").submit(60)
    cancelled = calc.nap.on(ready).submit(60)
    wait_for(lambda: cancelled.status().state == JobState.RUNNING, what="the nap running")
    cancelled.cancel()
    # Then result() raises fleet's errors, saying what ended them
    with pytest.raises(JobFailed, match=r"FAILED: .*time limit") as failed:
        limited.result(timeout=120)
    assert not isinstance(failed.value, JobCancelled)
    with pytest.raises(JobCancelled, match="CANCELLED"):
        cancelled.result(timeout=120)


def test_calls_wait_for_other_calls_and_take_their_results_without_the_caller(
    ready: Client, calc: ModuleType
) -> None:
    # Given a first call held back by a job that cannot be placed here yet (it asks for another GPU)
    gate = ready.submit(
        JobSpec(name="gate", command=["true"], gpus=1, gpu_model="no-such-gpu", allow_unplaceable=True)
    )
    withdraw = calc.withdraw.on(ready)
    first = withdraw.submit(100, 1, after=[f"{gate.id}:any"])
    # When its handle is passed to a second call, and both handles, nested, to a third
    second = withdraw.submit(first, 9)
    third = calc.gather.on(ready).submit([second, (first,)], named={"k": second})
    # Then both are queued without the first having run, each waiting for the calls it takes
    assert first.status().state == JobState.QUEUED
    assert {(d.job, d.when) for d in third.status().spec.after} == {(first.id, "ok"), (second.id, "ok")}
    # And once the first may run, each call gets the one before's return value in its handle's place
    gate.cancel()
    assert third.result(timeout=120) == {"parts": ([90, (99,)],), "named": {"named": {"k": 90}}}
    assert second.result(timeout=10) == 90

    # Given a call that raises, one after it, one taking its result, and one after it in any case
    failing = withdraw.submit(10, 25)
    skipped = calc.squares.on(ready).submit(3, after=[failing])
    taking = calc.squares.on(ready).submit(failing)
    tidy = calc.squares.on(ready).submit(2, after=[f"{failing.id}:any"])
    # Then those that needed it to succeed are cancelled, the one taking its result saying so
    with pytest.raises(JobCancelled):
        skipped.result(timeout=120)
    assert skipped.status().reason == f"dependency {failing.id} ended FAILED (after ok)"
    with pytest.raises(
        JobCancelled, match=rf"squares was not called: it takes the result of job {failing.id},"
    ):
        taking.result(timeout=120)
    # And the last runs to its result
    assert tidy.result(timeout=120)["sum"] == 1


def test_an_unpicklable_argument_is_refused_before_anything_is_sent(
    ready: Client, calc: ModuleType, redis: Redis
) -> None:
    # Given an argument that cannot be pickled (a lock)
    lock = threading.Lock()
    # When the call is submitted
    with pytest.raises(SpecError) as refused:
        calc.withdraw.on(ready).submit(lock, amount=1)
    # Then the refusal names the argument and what it is
    assert "withdraw: argument 1" in str(refused.value) and "lock" in str(refused.value)
    # And nothing reached the fleet: no job, no uploaded call
    assert ready.jobs() == [] and list(redis.scan_iter("*blob*")) == []


def test_a_checkpointing_function_resumes_after_its_node_is_lost(
    procs: FleetProcs, ready: Client, calc: ModuleType
) -> None:
    # Given a function that checkpoints each step, running on node t-fn, and a second node
    handle = calc.count_to.on(ready).submit(40, 0.1)
    wait_for(lambda: "step 5" in handle.logs(), what="5 steps on t-fn", procs=procs)
    procs.agent("t-spare", gpus=2)
    procs.wait_nodes(ready, 2)
    # When its node loses power
    procs.kill_node("t-fn")
    # Then result() waits through the requeue, and the second attempt resumed from a checkpoint
    # and returns the sum of every step counted once
    value = handle.result(timeout=120)
    assert value["total"] == sum(range(40)) and value["attempt"] == 2 and value["resumed_from"] >= 5
    states = [e.state for e in handle.history()]
    assert states.count("SUCCEEDED") == 1 and handle.status().node == "t-spare"


def test_a_call_that_cannot_be_made_on_the_node_says_why(
    ready: Client, calc: ModuleType, tmp_path: Path
) -> None:
    # Given a function whose module is not shipped with it (an empty workdir)
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    unshipped = calc.squares.on(ready).options(workdir=str(empty))
    # When it is called on the fleet, then the fleet error says the module was not found, and how
    with pytest.raises(JobFailed, match=r"squares was not called: cannot import 'calc'.*workdir='\.'"):
        unshipped.submit(3).result(timeout=120)


def test_the_cli_shows_a_calls_function_and_prints_its_result(
    ready: Client, calc: ModuleType, api: Api
) -> None:
    # Given a function job that returned, and one that raised
    returned, raised = calc.squares.on(ready).submit(3), calc.withdraw.on(ready).submit(1, 2)
    assert returned.result(timeout=120)["sum"] == 5
    project = Path(calc.__file__).parent
    env = {**api.env(), "FLEET_API_URL": ready.transport.url}

    def fleet(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(Path(sys.executable).parent / "fleet"), *args]
        return subprocess.run(argv, env=env, cwd=project, capture_output=True, text=True, timeout=60)

    # When fleet show is asked, then it names the function, its arguments and the result's size
    shown = fleet("show", returned.id).stdout
    assert "calc.squares(3)" in shown and f"(fleet result {returned.id})" in shown
    # And so does the job's page
    page = urllib.request.Request(f"{env['FLEET_API_URL']}/ui/jobs/{returned.id}")
    page.add_header("Cookie", f"fleet_token={api.token}")
    with urllib.request.urlopen(page, timeout=30) as response:
        html = response.read().decode()
    assert re.search(r'id="job-function"><code>calc\.squares\(3\)</code> · result kept: \d+', html), html
    # And fleet result prints the value, as a repr or as JSON
    printed = fleet("result", returned.id)
    assert printed.returncode == 0 and printed.stdout.startswith("{'sum': 5, ")
    assert json.loads(fleet("result", returned.id, "-o", "json").stdout)["sum"] == 5
    # And a function's exception comes with the node's traceback, exit 1
    failed = fleet("result", raised.id)
    assert failed.returncode == 1 and "calc.Overdrawn: 2 is more than 1" in failed.stderr
    assert "raised on the fleet" in failed.stderr and failed.stdout == ""


@pytest.mark.docker
def test_a_function_runs_in_the_python_image_without_fleet_installed(
    docker_procs: FleetProcs, api: Api, calc: ModuleType
) -> None:
    import docker

    try:
        docker.from_env().images.get(PYTHON_IMAGE)
    except docker.errors.ImageNotFound:
        need(False, f"{PYTHON_IMAGE} image missing (make images-test)")
    docker_procs.controller()
    docker_procs.agent("t-fn-docker", gpus=1)
    client = Client(start_api(docker_procs, "api-functions"), api.token)
    api.clients.append(client)
    docker_procs.wait_nodes(client, 1)
    # Given the user's module, which imports fleet, shipped to a container of fleet's python image,
    # which holds fleet_worker and cloudpickle but not fleet
    in_image = calc.squares.on(client).options(python="python3", image=PYTHON_IMAGE)
    # When a call of it runs there, then it comes back as on a process node
    value = in_image.submit(10).result(timeout=180)
    assert value["sum"] == 285 and value["gpus"].startswith("GPU-")
    with pytest.raises(calc.Overdrawn, match="3 is more than 1"):
        calc.withdraw.on(client).options(python="python3", image=PYTHON_IMAGE).submit(1, 3).result(
            timeout=180
        )


def test_a_calls_bytes_and_result_live_as_long_as_its_job_and_go_with_it(procs: FleetProcs, api: Api) -> None:
    # Given a fleet keeping uploads 1 s after their last use, and ended jobs 3 s
    procs.env.update(
        FLEET_WORKDIR_RETENTION_S="1",
        FLEET_JOB_RETENTION_S="3",
        FLEET_CONTROLLER__RETENTION_INTERVAL_S="0.5",
        FLEET_AGENT__CHECKPOINT_SWEEP_INTERVAL_S="0.3",
    )
    procs.controller()
    procs.agent("t-fn-ret", gpus=1)
    client = Client(start_api(procs, "api-functions-retention"), api.token)
    api.clients.append(client)
    procs.wait_nodes(client, 1)

    # (functions every node imports from the standard library: a shipped directory would expire as
    # fast as the calls)
    on_fleet = fleet.function(python=sys.executable, gpus=1)
    # When a call waits in the queue longer than that for another to end
    first = on_fleet(time.sleep).on(client).submit(2)
    second = on_fleet(math.factorial).on(client).submit(5, after=[first])
    # Then it runs all the same: its job held its call, and its result is read back
    assert second.result(timeout=120) == 120
    assert first.result(timeout=5) is None
    call = second.status().spec.call
    assert call is not None
    blob = Keys().blob(call.blob.removeprefix("sha256:"))
    kept = kept_dir(procs.root / "checkpoints", "default", second.id)
    assert kept.is_dir()
    r = Redis.from_url(procs.redis_url)
    # When retention deletes the job (3 s after it ended)
    wait_for(lambda: not r.exists(Keys().job(second.id)), timeout=60, what="the job deleted")
    # Then its call went with it, and its kept result with its outputs; result() says it expired
    assert not r.exists(blob)
    wait_for(lambda: not kept.exists(), timeout=30, what="the kept outputs removed")
    with pytest.raises(JobExpired):
        second.result(timeout=5)
    r.close()


def test_a_call_that_was_not_uploaded_is_refused_naming_it(client: Client) -> None:
    # Given specs naming a call by hand: one never uploaded, one that is no digest at all
    spec = {"name": "f", "command": ["python3", "-m", "fleet_worker.call", "outputs"]}
    missing = {**spec, "call": {"blob": "sha256:" + "0" * 64, "function": "calc.f"}}
    garbled = {**spec, "call": {"blob": "../../etc/passwd", "function": "calc.f"}}
    # When they are submitted, then each is refused, naming the field and the fix
    with pytest.raises(SpecError, match=r"call\.blob sha256:0+: not uploaded .*PUT /v1/blobs"):
        client.submit(missing)
    with pytest.raises(SpecError, match=r"call\.blob: .*sha256"):
        client.submit(garbled)
    assert client.jobs() == []
