"""What ``f.map`` yields, without a fleet: one job array whose tasks each find their own call, the
order, a failure in its place or raised after every earlier result, and the calls not yet started
cancelled when it stops; one job per call through an executor's futures where items hold handles."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import pickle
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fleet
from fleet.client import mapped
from fleet.client.executor import SLACK, results
from fleet.client.handles import JobHandle
from fleet.client.outcomes import FunctionHandle
from fleet.models import Job, JobSpec, JobState
from fleet.models.arrays import task_id
from fleet_worker import call as runner


def ended(*outcomes: Any) -> list[cf.Future[Any]]:
    """Futures resolved to ``outcomes`` (an exception: raised)."""
    futures: list[cf.Future[Any]] = []
    for outcome in outcomes:
        future: cf.Future[Any] = cf.Future()
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        futures.append(future)
    return futures


def test_results_come_in_the_inputs_order_with_a_failure_in_its_place() -> None:
    # Given calls of which the second failed
    futures = ended(1, KeyError("two"), 3)
    # When their results are read with return_exceptions
    got = list(results(None, futures, ordered=True, return_exceptions=True))
    # Then each is in its input's place, the failure too
    assert got[0] == 1 and isinstance(got[1], KeyError) and got[2] == 3


def test_a_failure_is_raised_after_every_earlier_result_and_the_rest_is_cancelled() -> None:
    # Given calls of which the second failed, and a third not started
    futures = [*ended(1, KeyError("two")), cf.Future()]
    seen: list[Any] = []
    # When their results are read without return_exceptions
    with pytest.raises(KeyError, match="two"):
        for value in results(None, futures, ordered=True, return_exceptions=False):
            seen.append(value)
    # Then the earlier result came first, and the call not started is cancelled
    assert seen == [1] and futures[2].cancelled()


def test_unordered_results_come_as_the_calls_end() -> None:
    # Given a call still running and one that ended
    running: cf.Future[Any] = cf.Future()
    running.set_running_or_notify_cancel()
    futures = [running, *ended("second")]
    # When results are read as they end
    got = results(None, futures, ordered=False, return_exceptions=False)
    # Then the ended one comes first
    assert next(got) == "second"
    running.set_result("first")
    assert list(got) == ["first"]


def test_closing_the_results_early_cancels_the_calls_not_started() -> None:
    futures = [*ended(1), cf.Future(), cf.Future()]
    got = results(None, futures, ordered=True, return_exceptions=False)
    assert next(got) == 1
    got.close()
    assert [f.cancelled() for f in futures] == [False, True, True]


def test_an_executor_is_the_standard_librarys() -> None:
    # Code written for concurrent.futures takes it as it takes a ProcessPoolExecutor
    assert issubclass(fleet.Executor, cf.Executor)
    with pytest.raises(fleet.SpecError, match="max_running 0: expected a whole number"):
        fleet.Executor(max_running=0)


class Fleet:
    """Stands in for a :class:`fleet.Client` as an executor uses it: each job ends, returning its
    number doubled, one at a time as the executor waits; ``out`` counts the jobs queued or running."""

    def __init__(self) -> None:
        self.jobs_: dict[str, Job] = {}
        self.specs: list[dict[str, Any]] = []  # as submitted
        self.most_out = 0
        self.transport = SimpleNamespace(close=lambda: None)
        self.limits: list[int] = []  # of each listing

    def upload_blob(self, data: bytes) -> str:
        return "sha256:" + "0" * 64

    def submit_many(self, specs: list[dict[str, Any]]) -> list[SimpleNamespace]:
        self.specs += specs
        ids = [f"call-{len(self.jobs_) + i}" for i in range(len(specs))]
        for job_id in ids:
            self.jobs_[job_id] = Job(id=job_id, spec=JobSpec(name="c", command=["c"]), state=JobState.QUEUED)
        self.most_out = max(self.most_out, sum(not j.state.final for j in self.jobs_.values()))
        return [SimpleNamespace(id=job_id) for job_id in ids]

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        job = self.jobs_[job_id]
        if not job.state.final:
            update = {"state": JobState.SUCCEEDED, "attempt": 1, "outputs_attempt": 1}
            self.jobs_[job_id] = job.model_copy(update=update)
        return self.jobs_[job_id]

    def jobs(self, labels: dict[str, str], limit: int) -> list[Job]:
        self.limits.append(limit)
        return list(reversed(self.jobs_.values()))[:limit]  # newest first, as the API lists

    def cancel_jobs(self, ids: list[str]) -> None:
        for job_id in ids:
            self.jobs_[job_id] = self.jobs_[job_id].model_copy(update={"state": JobState.CANCELLED})

    def download(self, job_id: str, path: str, dest: str) -> list[Path]:
        number = int(job_id.split("-")[1])
        file = Path(dest) / runner.OUTCOME
        file.write_bytes(
            runner.pack(runner.OUTCOME_MAGIC, {"status": runner.RETURNED}, pickle.dumps(2 * number))
        )
        return [file]


def test_an_executor_keeps_at_most_max_running_out_and_resolves_every_future() -> None:
    # Given an executor that may have 3 calls out at once
    fake = Fleet()
    with fleet.Executor(gpus=0, client=fake, max_running=3, poll_s=0.01) as pool:  # type: ignore[arg-type]
        # When 10 calls are submitted
        futures = [pool.submit(abs, n) for n in range(10)]
    # Then never more than 3 were queued or running, and each future holds its job's result
    assert fake.most_out <= 3
    assert [f.result() for f in futures] == [2 * n for n in range(10)]


def test_shutdown_cancelling_futures_cancels_the_calls_not_yet_out() -> None:
    # Given an executor with one call out and the rest held
    fake = Fleet()
    fake.wait = lambda job_id, timeout=None: fake.jobs_[job_id]  # type: ignore[method-assign]
    pool = fleet.Executor(gpus=0, client=fake, max_running=1, poll_s=0.01)  # type: ignore[arg-type]
    futures = [pool.submit(abs, n) for n in range(4)]
    # When it is shut down, cancelling its futures
    pool.shutdown(wait=True, cancel_futures=True)
    # Then every future is cancelled, and the job that was out is cancelled on the fleet
    assert all(f.cancelled() for f in futures)
    assert [j.state for j in fake.jobs_.values()] == [JobState.CANCELLED] * len(fake.jobs_)


def test_map_after_makes_every_call_wait_and_takes_a_calls_handle_as_its_result() -> None:
    # Given a function mapped over a call's handle and a number, every call after two other jobs
    fake = Fleet()
    double = fleet.function(gpus=0, client=fake)(abs)  # type: ignore[arg-type]
    prep = FunctionHandle(fake, "prep-1", "prep")
    got = list(double.map([prep, -2], after=[JobHandle(fake, "gate-1"), "setup-1:any"]))
    # Then each call waits for both, the one taking the handle for its job to succeed too
    assert [s["after"] for s in fake.specs] == [
        ["gate-1", "setup-1:any", "prep-1:ok"],
        ["gate-1", "setup-1:any"],
    ]
    assert fake.specs[0]["call"]["inputs"] == ["prep-1"] and "inputs" not in fake.specs[1]["call"]
    assert got == [0, 2]  # the fake's jobs return their number doubled
    # And anything but a job is refused before any call is sent
    with pytest.raises(fleet.SpecError, match=r"after: 3\.5 is not a job"):
        double.map([1], after=[3.5])
    assert len(fake.specs) == 2


def test_a_round_reads_the_jobs_out_not_every_job_sent_and_misses_none() -> None:
    # Given a fleet whose jobs end as they are listed, but for those held back
    fake, held = Fleet(), {"call-150", "call-151"}
    listing = fake.jobs

    def jobs(labels: dict[str, str], limit: int) -> list[Job]:
        done = {"state": JobState.SUCCEEDED, "attempt": 1, "outputs_attempt": 1}
        for job_id, job in fake.jobs_.items():
            if not job.state.final and job_id not in held:
                fake.jobs_[job_id] = job.model_copy(update=done)
        return listing(labels, limit)

    fake.jobs = jobs  # type: ignore[method-assign]
    fake.wait = lambda job_id, timeout=None: fake.jobs_[job_id]  # type: ignore[method-assign]
    with fleet.Executor(gpus=0, client=fake, max_running=3, poll_s=0.01) as pool:  # type: ignore[arg-type]
        # When 150 calls are made, at most 3 out at once
        first = [pool.submit(abs, n) for n in range(150)]
        assert [f.result(timeout=30) for f in first] == [2 * n for n in range(150)]
        # Then each round read the jobs out and a few more, never every job sent
        assert max(fake.limits) <= 3 + SLACK
        # When 150 more are made, the first two of them running until released
        later = [pool.submit(abs, n) for n in range(150, 300)]
        assert [f.result(timeout=30) for f in later[2:]] == [2 * n for n in range(152, 300)]
        # Then the second's end is seen while the first runs on, though it is older than a
        # round's few by then
        held.remove("call-151")
        assert later[1].result(timeout=30) == 302 and not later[0].done()
        held.clear()
        assert later[0].result(timeout=30) == 300


def test_each_task_of_a_map_finds_its_own_arguments_by_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a map's calls of a function imported on the node and of one that travels by value
    for fn, items, want in (
        (divmod, [(7, 2), (9, 4), (1, 1)], [(3, 1), (2, 1), (1, 0)]),
        (lambda a, b: f"{a}{b}", [("x", 1), ("y", 2)], ["x1", "y2"]),
    ):
        blob = mapped.calls_blob(fn, items)
        assert blob is not None
        for index, expected in enumerate(want):
            # When the runner of task `index` makes its call
            folder = tmp_path / f"{id(fn)}-{index}" / runner.FOLDER
            folder.mkdir(parents=True)
            (folder / runner.CALL).write_bytes(blob)
            monkeypatch.setenv("FLEET_ARRAY_INDEX", str(index))
            assert runner.run(str(folder.parent)) == 0
            # Then it made the call of its own item, and kept no arguments beside its outcome
            header, payload = runner.unpack(runner.OUTCOME_MAGIC, (folder / runner.OUTCOME).read_bytes())
            assert header["status"] == runner.RETURNED and pickle.loads(payload) == expected
            assert not (folder / runner.CALL).exists()
    # And an index the map does not hold, or none, is refused in words
    with pytest.raises(runner.Refused, match="FLEET_ARRAY_INDEX 3: the map holds tasks 0 to 2"):
        runner.task_calls(mapped.calls_blob(divmod, [(1, 1)] * 3) or b"", 3)
    folder = tmp_path / "none" / runner.FOLDER
    folder.mkdir(parents=True)
    (folder / runner.CALL).write_bytes(mapped.calls_blob(divmod, [(1, 1)]) or b"")
    monkeypatch.delenv("FLEET_ARRAY_INDEX")
    assert runner.run(str(folder.parent)) == 1
    assert b"a map's call runs as a task of its job array" in (folder / runner.OUTCOME).read_bytes()


def test_a_map_holding_a_handle_or_too_many_bytes_goes_one_job_per_call() -> None:
    fake = Fleet()
    assert mapped.calls_blob(abs, [(1,), (FunctionHandle(fake, "prep-1", "prep"),)]) is None
    big = b"x" * (mapped.MAP_BLOB_MAX // 2)
    assert mapped.calls_blob(len, [(big,), (big,), (big,)]) is None
    assert mapped.calls_blob(len, [(big,)]) is not None
    with pytest.raises(fleet.SpecError, match=r"item 1: len: argument 1 \(<generator"):
        mapped.calls_blob(len, [(1,), ((x for x in ()),)])


class ArrayFleet:
    """Stands in for a :class:`fleet.Client` as a map's array uses it: a task runs, through the real
    runner, when it is waited for; the others stay queued until then."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp, self.env = tmp_path, monkeypatch
        self.blobs: dict[str, bytes] = {}
        self.arrays: list[tuple[dict[str, Any], list[int], int | None]] = []
        self.tasks: dict[str, Job] = {}
        self.cancelled: list[str] = []

    def upload_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest

    def submit_array(self, spec: dict[str, Any], indices: range, max_running: int | None) -> Any:
        self.arrays.append((spec, list(indices), max_running))
        for i in indices:
            task = task_id("map-1", i)
            shape = JobSpec(name="c", command=["c"])
            self.tasks[task] = Job(
                id=task, spec=shape, state=JobState.QUEUED, array_id="map-1", array_index=i
            )
        return SimpleNamespace(id="map-1")

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        job = self.tasks[job_id]
        if job.state == JobState.QUEUED:
            folder = self.tmp / job_id / runner.FOLDER
            folder.mkdir(parents=True)
            (folder / runner.CALL).write_bytes(self.blobs[self.arrays[-1][0]["call"]["blob"]])
            self.env.setenv("FLEET_ARRAY_INDEX", str(job.array_index))
            code = runner.run(str(folder.parent))
            ended = {
                "state": JobState.FAILED if code else JobState.SUCCEEDED,
                "attempt": 1,
                "outputs_attempt": 1,
            }
            job = self.tasks[job_id] = job.model_copy(update=ended)
        return job

    def array(self, array_id: str) -> Any:
        return SimpleNamespace(tasks=Counter(j.state for j in self.tasks.values()))

    def jobs(self, labels: dict[str, str], limit: int) -> list[Job]:
        assert labels == {"fleet.array": "map-1"}
        return list(reversed(self.tasks.values()))[:limit]

    def cancel_jobs(self, ids: list[str], state: str) -> None:
        for job_id in ids:
            if self.tasks[job_id].state == state:
                self.cancelled.append(job_id)
                self.tasks[job_id] = self.tasks[job_id].model_copy(update={"state": JobState.CANCELLED})

    def download(self, job_id: str, path: str, dest: str) -> list[Path]:
        return [self.tmp / job_id / runner.FOLDER / runner.OUTCOME]


def test_a_map_is_one_array_whose_results_come_in_order_a_failure_raised_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a function mapped on a fleet, at most 2 calls on nodes at once
    fake = ArrayFleet(tmp_path, monkeypatch)
    divide = fleet.function(gpus=0, client=fake)(divmod)  # type: ignore[arg-type]
    seen: list[Any] = []
    # When one call of five raises
    with pytest.raises(ZeroDivisionError):
        for value in divide.map([9, 8, 7, 6, 5], [2, 3, 0, 1, 1], max_running=2):
            seen.append(value)
    # Then the map was one array of five tasks, one call each, limited as asked
    ((spec, indices, most),) = fake.arrays
    assert indices == [0, 1, 2, 3, 4] and most == 2 and spec["call"]["function"] == "builtins.divmod"
    assert spec["call"]["args"].startswith("*item[FLEET_ARRAY_INDEX] of 5: (9, 2), (8, 3)")
    # And the results before the failure came first, and the tasks still queued were cancelled
    assert seen == [(4, 1), (2, 2)]
    assert fake.cancelled == ["map-1-3", "map-1-4"]


def test_a_maps_failures_in_their_place_unordered_results_and_an_early_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = ArrayFleet(tmp_path, monkeypatch)
    divide = fleet.function(gpus=0, client=fake)(divmod)  # type: ignore[arg-type]
    # With return_exceptions, every call runs and a failure is yielded in its place
    got = list(divide.map([4, 1, 9], [2, 0, 3], return_exceptions=True))
    assert got[0] == (2, 0) and isinstance(got[1], ZeroDivisionError) and got[2] == (3, 0)
    assert not fake.cancelled
    # Unordered, each result comes as its task ends
    fake = ArrayFleet(tmp_path / "unordered", monkeypatch)
    divide = divide.on(fake)  # type: ignore[arg-type]
    assert sorted(divide.map([5, 6, 7], [1, 1, 1], ordered=False)) == [(5, 0), (6, 0), (7, 0)]
    # Closing the results early cancels the tasks still queued
    fake = ArrayFleet(tmp_path / "closed", monkeypatch)
    results_ = divide.on(fake).map([1, 2, 3], [1, 1, 1])  # type: ignore[arg-type]
    assert next(results_) == (1, 0)
    results_.close()
    assert fake.cancelled == ["map-1-1", "map-1-2"]
    # And nothing is sent for no items
    assert list(divide.on(fake).map([])) == [] and len(fake.arrays) == 1  # type: ignore[arg-type]
