"""Job array indices: what `--array` accepts, how it is stored, and what it refuses (naming why)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.cli.main import main
from fleet.errors import SpecError
from fleet.models import JobSpec
from fleet.models.arrays import ARRAY_TASKS_MAX, normal_form, parse_indices, task_ids


@pytest.mark.parametrize(
    ("text", "indices", "stored"),
    [
        ("0-9", tuple(range(10)), "0-9"),
        ("1,3,5-9", (1, 3, 5, 6, 7, 8, 9), "1,3,5-9"),
        (" 7 ", (7,), "7"),
        ("5-9,0-4", tuple(range(10)), "0-9"),
        ("0-99999", tuple(range(ARRAY_TASKS_MAX)), "0-99999"),
        ("9999999", (9999999,), "9999999"),
    ],
)
def test_indices_parse_sorted_and_are_stored_as_runs(
    text: str, indices: tuple[int, ...], stored: str
) -> None:
    assert parse_indices(text) == indices
    assert normal_form(indices) == stored


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "expected indices like 0-99 or 1,3,5-9"),
        ("a-b", "'a-b' is not an index or a range"),
        ("1,,2", "'' is not an index or a range"),
        ("-3", "'-3' is not an index or a range"),
        ("9-5", "range 9-5 runs backwards; write 5-9"),
        ("1,2,1", "index 1 appears twice"),
        ("0-5,3-9", "index 3 appears twice"),
        ("0-100000", "an array holds at most 100000"),
        ("10000000", "indices run from 0 to 9999999"),
        ("1.5", "'1.5' is not an index or a range"),
    ],
)
def test_bad_indices_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_indices(text)
    assert why in str(err.value)


@given(st.sets(st.integers(0, 5000), min_size=1, max_size=300))
def test_the_stored_form_reads_back_as_the_same_indices(indices: set[int]) -> None:
    ordered = tuple(sorted(indices))
    assert parse_indices(normal_form(ordered)) == ordered
    assert task_ids("a", normal_form(ordered)) == [f"a-{i}" for i in ordered]


def test_fleet_labels_are_reserved_for_array_tasks() -> None:
    with pytest.raises(SpecError, match=r"'fleet.array': fleet\.\* labels are set by fleet itself"):
        JobSpec.parse({"name": "j", "command": ["true"], "labels": {"fleet.array": "x"}})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--array", "5-1"], "--array '5-1': range 5-1 runs backwards; write 1-5"),
        (["--array", "x"], "--array 'x': 'x' is not an index or a range A-B"),
        (["--array", ""], "--array '': expected indices like 0-99 or 1,3,5-9"),
        (["--array", "0-100000"], "--array '0-100000': more than 100000 tasks"),
        (["--array", "0-9", "--max-running", "0"], "--max-running 0: expected at least 1 task"),
        (["--max-running", "2"], "--max-running: only with --array"),
    ],
)
def test_cli_rejects_a_bad_array_with_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no reachable Redis: a bad array is refused before anything is sent
    code = main(["--redis-url", "redis://127.0.0.1:1/0", "submit", *argv, "--", "true"])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_max_running_must_be_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--array", "0-9", "--max-running", "many", "--", "true"]) == 2
    assert "fleet: --max-running: 'many' is not a valid integer" in capsys.readouterr().err
