"""``f.map(..., chunksize=N)`` and ``fleet.Executor.map(..., chunksize=N)`` without a fleet: a task
makes N calls in one process, each call's outcome kept (``fleet-outcomes 1``), so one call's
exception loses no other's result, and the caller yields each call's result in its place."""

from __future__ import annotations

import hashlib
import itertools
import json
import pickle
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cloudpickle
import pytest

import fleet
from fleet.client import mapped
from fleet.client.outcomes import FunctionHandle, Outcome, Outcomes, read
from fleet.errors import FleetError, JobFailed
from fleet.models import Job, JobSpec, JobState
from fleet_worker import call as runner
from fleet_worker import formats
from tests.unit.test_function_map import ArrayFleet


def a_task(state: JobState = JobState.FAILED, reason: str = "exited 1") -> Job:
    return Job(id="map-1-0", spec=JobSpec(name="c", command=["c"]), state=state, reason=reason)


def run_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blob: bytes, index: int | None
) -> tuple[int, bytes]:
    """The runner of task ``index`` (None: a job of no array) on ``blob``: its exit and outcome."""
    folder = tmp_path / f"task-{index}" / runner.FOLDER
    folder.mkdir(parents=True)
    (folder / runner.CALL).write_bytes(blob)
    if index is None:
        monkeypatch.delenv("FLEET_ARRAY_INDEX", raising=False)
    else:
        monkeypatch.setenv("FLEET_ARRAY_INDEX", str(index))
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = runner.run(str(folder.parent))
    return code, (folder / runner.OUTCOME).read_bytes()


def test_a_chunked_maps_tasks_each_hold_their_calls_and_chunksize_1_is_the_old_format() -> None:
    # Given 7 calls packed 3 to a task
    blob = mapped.calls_blob(divmod, [(n, 1) for n in range(7)], 3)
    assert blob is not None and blob.startswith(formats.CHUNKS_MAGIC)
    # Then task i holds calls 3i to 3i+2, the last one what is left, each its own item's
    for index, first, count in ((0, 0, 3), (1, 3, 3), (2, 6, 1)):
        header, function, calls, start = formats.task_calls(blob, index)
        assert (start, len(calls), function, header["chunksize"]) == (first, count, b"", 3)
        assert [pickle.loads(c) for c in calls] == [((n, 1), {}) for n in range(first, first + count)]
    # And a task the map does not hold is refused in words, as is a chunked file without an index
    with pytest.raises(formats.Refused, match="FLEET_ARRAY_INDEX 3: the map holds tasks 0 to 2"):
        formats.task_calls(blob, 3)
    with pytest.raises(formats.Refused, match="a map's call runs as a task of its job array"):
        formats.task_calls(blob, None)
    # And chunksize 1 writes the format of a task per call as the last release did, byte for byte (a
    # runner of that release reads it), while a chunked file has a magic that runner refuses
    # rather than make one call of each task
    single = mapped.calls_blob(divmod, [(n, 1) for n in range(7)])
    calls = [cloudpickle.dumps(((n, 1), {})) for n in range(7)]
    header = {**formats.versions(), "module": "builtins", "qualname": "divmod"}
    header.update(function=0, ends=list(itertools.accumulate(len(c) for c in calls)))
    assert single == formats.CALLS_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + b"".join(
        calls
    )


def test_a_task_makes_every_call_in_one_process_and_keeps_each_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a function that travels by value, counts its calls in its own default, and fails for 0
    def tally(x: int, seen: list[int] = []) -> int:  # noqa: B006 (the count is the point)
        seen.append(x)
        return len(seen) * 100 // x

    blob = mapped.calls_blob(tally, [(5,), (0,), (4,), (2,)], 3)
    assert blob is not None
    # When task 0 (calls 0 to 2) runs
    code, data = run_task(tmp_path, monkeypatch, blob, 0)
    # Then it exits 1, one of its calls having raised, and left each call's outcome in turn
    assert code == 1
    outcomes = Outcomes(data)
    assert (outcomes.first, outcomes.count, len(outcomes.calls)) == (0, 3, 3)
    assert [o.status for o in outcomes.calls] == [runner.RETURNED, runner.RAISED, runner.RETURNED]
    # And the function was unpickled once for all of them (its default counted every call), and
    # the call after the one that raised was made
    job = a_task()
    assert outcomes.call(0, job, "tally") == 20 and outcomes.call(2, job, "tally") == 75
    with pytest.raises(ZeroDivisionError):
        outcomes.call(1, job, "tally")
    # And a task whose every call returned exits 0: task 1 holds call 3 only, item 3 of the map
    code, data = run_task(tmp_path, monkeypatch, blob, 1)
    assert code == 0 and Outcomes(data).first == 3 and Outcomes(data).call(0, job, "tally") == 50


def test_a_task_killed_midway_keeps_the_calls_that_ended_and_says_which_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a task's outcomes cut short in its third call's (the task killed while it wrote it)
    blob = mapped.calls_blob(divmod, [(9, 2), (8, 3), (7, 1)], 3)
    _, data = run_task(tmp_path, monkeypatch, blob or b"", 0)
    cut = data[: len(data) - 5]
    # When they are read
    outcomes = Outcomes(cut)
    # Then the calls that ended come back, and the one that did not is a JobFailed naming its item
    job = a_task(reason="time limit 1m reached")
    assert outcomes.call(0, job, "divmod") == (4, 1) and outcomes.call(1, job, "divmod") == (2, 2)
    with pytest.raises(
        JobFailed, match=r"time limit 1m reached\) before divmod ended for item 2: 2 of its 3"
    ):
        outcomes.call(2, job, "divmod")
    # And the task's result as a whole (``fleet result``) is its values in order, the first
    # exception raised with a note naming its item
    with pytest.raises(JobFailed) as failed:
        outcomes.value(job, "divmod")
    assert "item 2: call 3 of the 3 job map-1-0 made" in failed.value.__notes__
    assert Outcomes(data).value(job, "divmod") == [(4, 1), (2, 2), (7, 0)]


def test_an_outcome_of_an_unknown_format_is_refused_in_words() -> None:
    job = a_task()
    for data in (b"fleet-outcomes 2\n{}\n", b'fleet-outcomes 1\n{"first": 0}\n', b"PK\x03\x04zip"):
        with pytest.raises(FleetError, match=r"its outcome \('.*'\) cannot be read here .*same release"):
            read(data, job)
    # And the formats it knows are read as theirs
    single = runner.pack(runner.OUTCOME_MAGIC, {"status": runner.RETURNED}, pickle.dumps(7))
    assert isinstance(read(single, job), Outcome)
    assert isinstance(read(runner.pack(runner.OUTCOMES_MAGIC, {"first": 0, "calls": 0}, b""), job), Outcomes)


def test_a_task_whose_outcomes_grow_past_the_limit_refuses_the_call_that_would_pass_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a limit on a task's outcomes that one call's value of 1000 bytes nearly fills
    monkeypatch.setattr(runner, "OUTCOMES_MAX_BYTES", 2000)
    blob = mapped.calls_blob(bytes, [(1000,), (1000,), (10,)], 3)
    # When the task runs
    code, data = run_task(tmp_path, monkeypatch, blob or b"", 0)
    # Then the calls within it keep their values, the one past it says why and what to do
    outcomes, job = Outcomes(data), a_task()
    assert code == 1 and outcomes.call(0, job, "bytes") == bytes(1000)
    assert outcomes.calls[1].status == runner.REFUSED
    with pytest.raises(JobFailed, match="more than 2000 bytes: map with a smaller chunksize"):
        outcomes.call(1, job, "bytes")
    assert outcomes.call(2, job, "bytes") == bytes(10)


def test_a_call_that_cannot_be_made_at_all_stands_for_each_call_of_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a task of a chunked map pickled by another Python
    blob = mapped.calls_blob(divmod, [(1, 1), (2, 1)], 2) or b""
    header, payload = formats.unpack(formats.CHUNKS_MAGIC, blob)
    code, data = run_task(
        tmp_path, monkeypatch, formats.pack(formats.CHUNKS_MAGIC, {**header, "python": "3.99.0"}, payload), 0
    )
    # Then its one outcome says why, for each of its calls
    assert code == 1 and data.startswith(runner.OUTCOME_MAGIC)
    handle = FunctionHandle[Any](SimpleNamespace(), "map-1-0", "divmod")
    handle._outcome = (1, read(data, a_task()))
    job = a_task().model_copy(update={"attempt": 1})
    for number in (0, 1):
        with pytest.raises(JobFailed, match=r"pickled by Python 3\.99\.0"):
            handle._call_of(job, number)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "25", None])
def test_a_bad_chunksize_is_refused_naming_it(bad: object) -> None:
    double = fleet.function(gpus=0)(abs)
    with pytest.raises(
        fleet.SpecError, match=rf"chunksize {bad!r}: expected a whole number of calls per task"
    ):
        double.map([1, 2], chunksize=bad)  # type: ignore[arg-type]
    with pytest.raises(fleet.SpecError, match="chunksize=25 makes 40 tasks of a map of 1,000 items"):
        fleet.Executor(gpus=0).map(abs, [1, 2], chunksize=bad)  # type: ignore[arg-type]


def test_a_chunked_map_is_an_array_of_fewer_tasks_each_result_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a function mapped over 7 items, 3 calls a task, one call failing
    fake = ArrayFleet(tmp_path, monkeypatch)
    divide = fleet.function(gpus=0, client=fake)(divmod)  # type: ignore[arg-type]
    divisors = [1, 2, 3, 0, 5, 6, 7]
    # When the failures are returned in place
    got = list(divide.map([42] * 7, divisors, chunksize=3, return_exceptions=True))
    # Then the map was one array of 3 tasks, and every call's result is in its place
    ((spec, indices, _),) = fake.arrays
    assert indices == [0, 1, 2]
    assert spec["call"]["args"].startswith(
        "*item for item in items[FLEET_ARRAY_INDEX*3:FLEET_ARRAY_INDEX*3+3] of 7: (42, 1), (42, 2)"
    )
    assert isinstance(got.pop(3), ZeroDivisionError)
    assert got == [divmod(42, d) for d in divisors if d]
    # And the task holding the failure FAILED, the others SUCCEEDED
    assert [j.state for j in fake.tasks.values()] == [JobState.SUCCEEDED, JobState.FAILED, JobState.SUCCEEDED]
    # And ``result()`` of that task (``fleet result``) raises the failure, naming its item
    with pytest.raises(ZeroDivisionError) as failed:
        FunctionHandle[Any](fake, "map-1-1", "divmod").result()  # type: ignore[arg-type]
    assert "item 3: call 1 of the 3 job map-1-1 made" in failed.value.__notes__
    assert FunctionHandle[Any](fake, "map-1-2", "divmod").result() == [(6, 0)]  # type: ignore[arg-type]


def test_a_chunked_map_raises_a_failure_in_its_place_and_unordered_yields_each_task_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a map of 2 calls a task whose fourth call raises
    fake = ArrayFleet(tmp_path, monkeypatch)
    divide = fleet.function(gpus=0, client=fake)(divmod)  # type: ignore[arg-type]
    seen: list[Any] = []
    with pytest.raises(ZeroDivisionError):
        for value in divide.map([8] * 7, [1, 2, 4, 0, 8, 1, 1], chunksize=2):
            seen.append(value)
    # Then every result before it came first, its task's other call too, and the rest is cancelled
    assert seen == [(8, 0), (4, 0), (2, 0)]
    assert fake.cancelled == ["map-1-2", "map-1-3"]
    # And unordered, each task's calls come in order as it ends, every one of them
    fake = ArrayFleet(tmp_path / "unordered", monkeypatch)
    got = list(divide.on(fake).map(range(5), [1] * 5, chunksize=2, ordered=False))  # type: ignore[arg-type]
    assert sorted(got) == [(n, 0) for n in range(5)] and len(fake.arrays[0][1]) == 3


class JobsFleet:
    """Stands in for a :class:`fleet.Client` as ``fleet.Executor`` uses it: a job runs, through the
    real runner (a job of no array), when it is waited for or listed."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp, self.env = tmp_path, monkeypatch
        self.blobs: dict[str, bytes] = {}
        self.specs: list[dict[str, Any]] = []
        self.jobs_: dict[str, Job] = {}
        self.transport = SimpleNamespace(close=lambda: None)

    def upload_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest

    def submit_many(self, specs: list[dict[str, Any]]) -> list[SimpleNamespace]:
        handles = []
        for spec in specs:
            job_id = f"call-{len(self.specs)}"
            self.specs.append(spec)
            self.jobs_[job_id] = Job(id=job_id, spec=JobSpec(name="c", command=["c"]), state=JobState.QUEUED)
            handles.append(SimpleNamespace(id=job_id))
        return handles

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        job = self.jobs_[job_id]
        if job.state == JobState.QUEUED:
            blob = self.blobs[self.specs[int(job_id.split("-")[1])]["call"]["blob"]]
            code, _ = run_task(self.tmp / job_id, self.env, blob, None)
            ended = {
                "state": JobState.FAILED if code else JobState.SUCCEEDED,
                "attempt": 1,
                "outputs_attempt": 1,
            }
            job = self.jobs_[job_id] = job.model_copy(update=ended)
        return job

    def jobs(self, labels: dict[str, str], limit: int) -> list[Job]:
        return [self.wait(job_id) for job_id in reversed(self.jobs_)][:limit]

    def cancel_jobs(self, ids: list[str]) -> None:
        for job_id in ids:
            self.jobs_[job_id] = self.jobs_[job_id].model_copy(update={"state": JobState.CANCELLED})

    def download(self, job_id: str, path: str, dest: str) -> list[Path]:
        return [self.tmp / job_id / f"task-{None}" / runner.FOLDER / runner.OUTCOME]


def test_executor_map_with_chunksize_makes_a_job_per_chunk_and_raises_a_failure_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an executor on a fleet
    fake = JobsFleet(tmp_path, monkeypatch)
    with fleet.Executor(gpus=0, client=fake, poll_s=0.01) as pool:  # type: ignore[arg-type]
        # When 7 calls are mapped 3 to a job, the sixth failing
        seen: list[Any] = []
        with pytest.raises(ZeroDivisionError):
            for value in pool.map(divmod, [6] * 7, [1, 2, 3, 6, 1, 0, 1], chunksize=3, timeout=60):
                seen.append(value)
        # Then it was 3 jobs, each making its own items', and every value before the failure came
        assert len(fake.specs) == 3
        assert fake.specs[1]["call"]["args"] == "*item for item in items[3:6]: (6, 6), (6, 1), (6, 0)"
        assert seen == [(6, 0), (3, 0), (2, 0), (1, 0), (6, 0)]
        # And a map of no failure yields every value in order, as the standard library's does
        assert list(pool.map(abs, range(-4, 0), chunksize=3)) == [4, 3, 2, 1] and len(fake.specs) == 5
        # And chunksize 1 is a job per call, as before
        assert list(pool.map(abs, [-1, -2])) == [1, 2] and len(fake.specs) == 7


def test_executor_map_with_chunksize_times_out_as_the_standard_librarys_and_cancels_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an executor on a fleet whose jobs stay queued
    fake = JobsFleet(tmp_path, monkeypatch)
    fake.wait = lambda job_id, timeout=None: fake.jobs_[job_id]  # type: ignore[method-assign]
    fake.jobs = lambda labels, limit: list(reversed(fake.jobs_.values()))[:limit]  # type: ignore[method-assign]
    pool = fleet.Executor(gpus=0, client=fake, poll_s=0.01)  # type: ignore[arg-type]
    # When a map of two jobs of two calls is waited for past its timeout
    values = pool.map(abs, range(4), chunksize=2, timeout=1.0)
    for _ in range(100):
        if len(fake.jobs_) == 2:
            break
        time.sleep(0.01)
    with pytest.raises(TimeoutError):
        next(values)
    pool.shutdown(wait=True)
    # Then both jobs, sent and still queued, are cancelled on the fleet
    assert [j.state for j in fake.jobs_.values()] == [JobState.CANCELLED] * 2
