"""A call's result passed as another call's argument (``g.submit(f.submit(x))``), without a fleet:
how the caller pickles the handle and makes the job wait, what the API admits, what the node reads
from the first job's kept outputs, and how the second job's runner puts the result in its place."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleet.agent.inputs import passed_results
from fleet.agent.outputs import keep
from fleet.agent.runtime.base import LaunchSpec
from fleet.api.admission import check_inputs
from fleet.client.outcomes import FunctionHandle, Outcome
from fleet.client.pickled import call_spec, pickle_call
from fleet.errors import JobCancelled, JobFailed, LaunchError, SpecError
from fleet.models import Job, JobSpec, JobState
from fleet_worker import call as runner


def gather(*parts: Any, **named: Any) -> dict[str, Any]:
    return {"parts": parts, "named": named}


def handle(job_id: str) -> FunctionHandle[Any]:
    return FunctionHandle(SimpleNamespace(), job_id, "tests.unit.test_passed_results.gather")


def returned(value: Any) -> bytes:
    """An outcome as a job's runner leaves it when its function returned ``value``."""
    return runner._outcome(runner.RETURNED, value)


def run_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: bytes, inputs: dict[str, bytes]
) -> Outcome:
    """Run the runner on ``call`` as a node would: the call and the results it takes written where a
    launch writes them (``LaunchSpec.work_files``); its outcome."""
    launch = LaunchSpec(job_id="g-1", attempt=1, image="", command=(), env={}, call=call, inputs=inputs)
    for relative, data in launch.work_files().items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    runner.run("outputs")
    return Outcome((tmp_path / "outputs" / runner.FOLDER / runner.OUTCOME).read_bytes())


def a_job(state: JobState = JobState.FAILED, reason: str = "", **call: Any) -> Job:
    call = {"blob": "sha256:" + "0" * 64, "function": "g", **call}
    spec = JobSpec(name="g", command=["python3"], tenant="a", call=call)
    return Job(id="g-1", spec=spec, state=state, reason=reason)


def test_handles_anywhere_in_the_arguments_are_replaced_by_their_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a call whose arguments hold two calls' handles, in a list, a tuple, a dict and a kwarg
    first, second = handle("f-1"), handle("f-2")
    passed: list[str] = []
    call = pickle_call(gather, ([first, (second,)], {"k": first}), {"named": second}, passed)
    # Then the jobs whose results it takes are known before it is sent, one entry per handle
    assert passed == ["f-1", "f-2"]
    # When the job runs with the outcomes the node handed it
    inputs = {"f-1": returned(99), "f-2": returned({"sum": 5})}
    value = run_with(tmp_path, monkeypatch, call, inputs).value(a_job(), "gather")
    # Then each placeholder is that job's return value
    assert value == {"parts": ([99, ({"sum": 5},)], {"k": 99}), "named": {"named": {"sum": 5}}}
    # And the job's kept outputs hold neither the call nor the results it took
    assert os.listdir(tmp_path / "outputs" / runner.FOLDER) == [runner.OUTCOME]


def test_a_result_the_node_did_not_hand_over_is_a_call_not_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = pickle_call(gather, (handle("f-1"), handle("f-2")), {}, [])
    raised = runner._outcome(runner.RAISED, None, KeyError("boom"))
    outcome = run_with(tmp_path, monkeypatch, call, {"f-1": raised})
    with pytest.raises(
        JobFailed, match=r"gather was not called: job f-1, whose result is an argument .* returned none"
    ):
        outcome.value(a_job(), "gather")
    # And a map's task of several calls (chunksize) is no one value to take
    chunk = runner.pack(runner.OUTCOMES_MAGIC, {"first": 0, "calls": 1}, runner.outcome_entry(returned(1)))
    outcome = run_with(tmp_path / "chunk", monkeypatch, call, {"f-1": chunk, "f-2": returned(2)})
    with pytest.raises(JobFailed, match="job f-1, whose result is an argument, made several calls of a map"):
        outcome.value(a_job(), "gather")


def test_a_handle_outside_a_call_is_not_pickled() -> None:
    # pickled on its own, a handle says what it pickles as, and how to pickle its value
    with pytest.raises(TypeError, match=r"only as an argument of a function's call .* handle\.result\(\)"):
        pickle.dumps(handle("f-1"))


def test_the_job_of_a_call_taking_results_waits_for_them_to_succeed() -> None:
    # Given a call taking a result twice, and a function whose fields wait for another job
    uploaded: list[bytes] = []
    client: Any = SimpleNamespace(upload_blob=lambda data: uploaded.append(data) or "sha256:" + "1" * 64)
    fields = {"after": ["prep-1:any"]}
    # When its spec is made
    spec = call_spec(client, gather, "python3", fields, (handle("f-1"), [handle("f-1")]), {})
    # Then it names the job once as an input, and waits for it to succeed, after what it waited for
    assert spec["call"]["inputs"] == ["f-1"] and spec["after"] == ["prep-1:any", "f-1:ok"]
    assert fields == {"after": ["prep-1:any"]} and len(uploaded) == 1
    # And a call without handles has neither
    plain = call_spec(client, gather, "python3", {}, (1,), {})
    assert "inputs" not in plain["call"] and "after" not in plain


def test_the_api_admits_inputs_only_among_the_jobs_waited_for_to_succeed() -> None:
    spec = a_job(inputs=["f-1"]).spec
    with pytest.raises(SpecError, match=r"call\.inputs: job 'f-1' is not in after with when ok; .* f-1:ok"):
        check_inputs(spec)
    with pytest.raises(SpecError, match=r"call\.inputs: job 'f-1'"):
        check_inputs(
            spec.model_copy(update={"after": JobSpec(name="x", command=["y"], after=["f-1:any"]).after})
        )
    check_inputs(spec.model_copy(update={"after": JobSpec(name="x", command=["y"], after=["f-1"]).after}))


def test_a_call_cancelled_for_an_input_says_which_one_did_not_succeed() -> None:
    job = a_job(JobState.CANCELLED, "dependency f-2 ended FAILED (after ok)", inputs=["f-1", "f-2"])
    with pytest.raises(JobCancelled) as cancelled:
        handle("g-1")._result_of(job)
    assert str(cancelled.value) == (
        "job g-1 CANCELLED: dependency f-2 ended FAILED (after ok); tests.unit.test_passed_results.gather "
        "was not called: it takes the result of job f-2, which did not succeed (fleet result f-2 says why)"
    )


# -- the node: reading the results from the kept outputs --------------------------------------------


def upstream(job_id: str, tenant: str = "a", state: JobState = JobState.SUCCEEDED) -> Job:
    spec = JobSpec(name="f", command=["python3"], tenant=tenant)
    return Job(id=job_id, spec=spec, state=state, attempt=1, outputs_attempt=1)


def kept(root: Path, tmp_path: Path, tenant: str, job_id: str, outcome: bytes) -> None:
    """Keep ``outcome`` as job ``job_id``'s attempt 1 left it, as an agent keeps outputs."""
    work = tmp_path / f"work-{job_id}"
    (work / "outputs" / runner.FOLDER).mkdir(parents=True)
    (work / "outputs" / runner.FOLDER / runner.OUTCOME).write_bytes(outcome)
    assert keep(work, "outputs", root, tenant, job_id, 1, 1 << 30).kept is not None


def test_the_node_reads_each_input_from_the_jobs_own_tenants_kept_outputs(tmp_path: Path) -> None:
    # Given a call of tenant a taking the results of f-1 (its own) and of f-2, which is tenant b's
    root = tmp_path / "root"
    root.mkdir()
    kept(root, tmp_path, "a", "f-1", returned(1))
    kept(root, tmp_path, "b", "f-2", returned(2))
    jobs: Any = SimpleNamespace(get_many=lambda ids: [upstream("f-1"), upstream("f-2", tenant="b")])
    job = a_job(JobState.SCHEDULED, inputs=["f-1"])
    # Then its own job's outcome is read as it was kept
    assert passed_results(job, jobs, root) == {"f-1": returned(1)}
    # And another tenant's job is as unknown to it as a job that does not exist
    other = a_job(JobState.SCHEDULED, inputs=["f-1", "f-2"])
    with pytest.raises(
        LaunchError, match="job f-2, whose result is an argument of g: no such job in tenant 'a'"
    ):
        passed_results(other, jobs, root)


def test_the_node_refuses_an_input_that_did_not_succeed_or_left_no_outcome(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "work-f-3" / "outputs").mkdir(parents=True)
    assert keep(tmp_path / "work-f-3", "outputs", root, "a", "f-3", 1, 1 << 30).kept is not None
    found = {"f-1": upstream("f-1", state=JobState.FAILED), "f-3": upstream("f-3")}
    jobs: Any = SimpleNamespace(get_many=lambda ids: [found[i] for i in ids if i in found])
    with pytest.raises(LaunchError, match=r"job f-1, whose result .* is FAILED: it must have SUCCEEDED"):
        passed_results(a_job(JobState.SCHEDULED, inputs=["f-1"]), jobs, root)
    with pytest.raises(LaunchError, match=r"job f-3, whose result .* left no outcome in its kept outputs"):
        passed_results(a_job(JobState.SCHEDULED, inputs=["f-3"]), jobs, root)
