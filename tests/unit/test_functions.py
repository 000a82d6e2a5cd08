"""``@fleet.function`` without a fleet: what the decorator refuses, how a call is pickled, and what
the job's runner (``fleet_worker.call``) leaves as its outcome, read back as the caller reads it."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import fleet
from fleet.client.outcomes import Outcome
from fleet.client.pickled import job_name, pickle_call, summary
from fleet.errors import FleetError, JobFailed, SpecError
from fleet.models import Job, JobSpec, JobState
from fleet_worker import call as runner


def double(x: int) -> int:
    return 2 * x


def broken(x: int) -> int:
    raise KeyError(f"no {x}")


def a_job() -> Job:
    return Job(id="double-1", spec=JobSpec(name="double", command=["python3"]), state=JobState.FAILED)


def make_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes) -> Outcome:
    """Run the runner on ``data`` as a node would (the call in the outputs directory); its outcome."""
    folder = tmp_path / "outputs" / runner.FOLDER
    folder.mkdir(parents=True)
    (folder / runner.CALL).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    runner.run("outputs")
    return Outcome((folder / runner.OUTCOME).read_bytes())


def with_header(data: bytes, **changes: str) -> bytes:
    header, payload = runner.unpack(runner.CALL_MAGIC, data)
    return runner.pack(runner.CALL_MAGIC, {**header, **changes}, payload)


def test_a_decorated_function_still_runs_here() -> None:
    f = fleet.function(gpus=1)(double)
    assert f(21) == 42 and f.__name__ == "double" and f.name == "tests.unit.test_functions.double"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"gpu": 1}, "gpu: unknown field"),
        ({"command": ["sh"]}, "command: a function's job runs its call"),
        ({"timeout": "soon"}, "timeout"),
    ],
)
def test_a_bad_field_is_refused_at_decoration(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError, match=words):
        fleet.function(**fields)(double)


def test_a_function_not_at_module_level_is_refused() -> None:
    def inner() -> None: ...

    with pytest.raises(SpecError, match="inner is not defined at module level"):
        fleet.function(inner)


def test_an_argument_that_cannot_be_pickled_is_named() -> None:
    with pytest.raises(SpecError, match=r"double: argument lock= \(.*a lock\) cannot be pickled"):
        pickle_call(double, (1,), {"lock": threading.Lock()})


def test_arguments_are_summarised_for_fleet_show() -> None:
    assert summary((3, "x" * 100), {"lr": 0.1}) == "3, 'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx', lr=0.1"
    assert len(summary(("y" * 30,) * 100, {})) == 1000
    assert (job_name("_private_fn"), job_name("ünï"), job_name("__")) == ("private_fn", "n", "function")


def test_the_runner_returns_the_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = make_call(tmp_path, monkeypatch, pickle_call(double, (21,), {}))
    assert outcome.value(a_job(), "double") == 42


def test_the_functions_exception_comes_back_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = make_call(tmp_path, monkeypatch, pickle_call(broken, (7,), {}))
    with pytest.raises(KeyError, match="no 7") as raised:
        outcome.value(a_job(), "broken")
    assert 'raise KeyError(f"no {x}")' in raised.value.__notes__[0]


def test_another_python_is_reported_in_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a call pickled by another Python than the job's
    data = with_header(pickle_call(double, (1,), {}), python="3.99.1")
    # When the job's runner reads it, then the call is not made, and the caller is told why
    outcome = make_call(tmp_path, monkeypatch, data)
    with pytest.raises(JobFailed) as failed:
        outcome.value(a_job(), "double")
    here = ".".join(map(str, sys.version_info[:2]))
    assert f"pickled by Python 3.99.1 and the job runs Python {here}." in str(failed.value)
    assert "an image of Python 3.99" in str(failed.value)


def test_another_cloudpickle_that_cannot_read_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a call from another cloudpickle, whose pickle this one cannot read
    header = json.dumps({**runner.versions(), "cloudpickle": "9.0.0", "module": "x", "qualname": "y"})
    data = runner.CALL_MAGIC + header.encode() + b"\n" + b"\x80\x05not a pickle"
    # Then the outcome names both versions, not the unpickling error alone
    outcome = make_call(tmp_path, monkeypatch, data)
    with pytest.raises(JobFailed, match=r"pickled by cloudpickle 9\.0\.0 and the job has cloudpickle 3\."):
        outcome.value(a_job(), "y")


def cuda_tensor() -> None:
    raise RuntimeError(
        "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False"
    )


class OnAGpu:
    """Unpickles as torch does a CUDA tensor where there is no GPU (seen on a GPU node's outcome)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (cuda_tensor, ())


def test_a_value_that_cannot_be_rebuilt_here_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = Outcome(
        runner.pack(runner.OUTCOME_MAGIC, {"status": runner.RETURNED}, cloudpickle.dumps(OnAGpu()))
    )
    with pytest.raises(FleetError, match=r"cannot be rebuilt here .*return it on the CPU \(t\.cpu\(\)\)"):
        outcome.value(a_job(), "f")
