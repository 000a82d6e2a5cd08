"""What the CLI shows, without a fleet: progress, plain and terminal tables, shell completion, and
the refusals of a mistyped command or a config file that is not there."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.cli.jobs import _job_view, job_row
from fleet.cli.main import main
from fleet.cli.output import print_plain
from fleet.cli.view import Table, View
from fleet.models import Job, JobSpec, JobState, Progress
from fleet.progress import label


def job(progress: Progress | None) -> Job:
    spec = JobSpec(name="train", command=["python", "train.py"], gpus=1)
    return Job(
        id="train-1",
        spec=spec,
        state=JobState.RUNNING,
        attempt=1,
        node="n1",
        created_at=1.0,
        started_at=2.0,
        progress=progress,
    )


def plain(view: View, capsys: pytest.CaptureFixture[str]) -> str:
    print_plain(view)
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("progress", "text"),
    [
        (None, "-"),
        (Progress(step=450, total=1000), "45%"),
        (Progress(step=1200), "step 1200"),
        (Progress(step=5000, total=1000), "100%"),
    ],
)
def test_the_progress_column_is_a_percentage_against_a_total_else_the_step(
    progress: Progress | None, text: str
) -> None:
    assert label(progress) == text
    assert job_row(job(progress), now=10.0)[10] == text  # the PROGRESS column of `fleet jobs`


def test_show_draws_a_bar_against_the_total_and_names_the_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    # Given a job that reported step 450 of 1000 with its loss
    shown = plain(_job_view(job(Progress(step=450, total=1000, metrics={"loss": 0.25}))), capsys)
    # Then `fleet show` has a bar a script can read too
    line = next(line for line in shown.splitlines() if line.startswith("Progress:"))
    assert line == "Progress:   [##############................] 45%  step 450 of 1000  loss=0.25"
    # And without a total, the step alone; before any report, no progress line at all
    assert "Progress:   step 7\n" in plain(_job_view(job(Progress(step=7))), capsys)
    assert "Progress:" not in plain(_job_view(job(None)), capsys)


def test_a_terminal_table_cuts_free_text_then_leaves_out_optional_columns() -> None:
    from rich.console import Console

    from fleet.cli import tty

    rows = [("a-very-long-job-id-1", "RUNNING", "alice", "x" * 60)]
    table = Table(["ID", "STATE", "USER", "REASON"], rows, wide=3, optional=(2,))
    assert tty.fit(table, 200) == ([0, 1, 2, 3], {})  # room for everything
    assert tty.fit(table, 60) == ([0, 1, 2, 3], {3: 60 - 20 - 7 - 5 - 3})  # REASON cut short
    assert tty.fit(table, 40) == ([0, 1, 3], {3: tty.MIN_WIDE})  # then USER left out
    # And rendered, every line fits and the id is whole
    out = io.StringIO()
    tty._console = Console(file=out, width=40, force_terminal=True, color_system="standard")
    try:
        tty.print_view(View([table]))
    finally:
        tty._console = None
    lines = out.getvalue().splitlines()
    assert "a-very-long-job-id-1" in lines[1] and "\x1b[32m" in lines[1]  # RUNNING in green
    assert all(len(tty.Text.from_ansi(line).plain) <= 40 for line in lines)


def fleet(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o nosort -F"),
        ("zsh", "#compdef fleet"),
        ("fish", "complete --no-files --command fleet"),
    ],
)
def test_completion_prints_the_shells_script(shell: str, marker: str) -> None:
    done = fleet("completion", shell)
    assert done.returncode == 0 and marker in done.stdout and "_FLEET_COMPLETE" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("fleet sub", "plain,submit"),
        ("fleet jobs --st", "plain,--state"),
        ("fleet jobs --state RU", "plain,RUNNING"),
        ("fleet install ", "plain,agent\nplain,api\nplain,controller\nplain,redis"),
        ("fleet completion ", "plain,bash\nplain,zsh\nplain,fish"),
    ],
)
def test_the_completion_script_is_answered_with_commands_options_and_choices(
    words: str, expected: str
) -> None:
    # What the bash script asks fleet when Tab is pressed after WORDS
    cword = str(len(words.split()) - (0 if words.endswith(" ") else 1))
    done = fleet(_FLEET_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=cword)
    assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = fleet("completion", "tcsh")
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == "fleet: SHELL: 'tcsh' is not one of 'bash', 'zsh', 'fish' (see `fleet completion --help`)\n"
    )


def test_fleet_show_says_what_a_learning_job_reported_or_that_it_reported_nothing() -> None:
    from fleet.cli.elastic import fields

    spec = JobSpec.parse(
        {"name": "e", "command": ["x"], "gpus": "1-4", "batch_size": "64-512", "profile": "learn"}
    )
    quiet = Job(id="e-1", spec=spec, state=JobState.RUNNING, num_gpus=1, batch_size=64)
    assert [(f.label, f.value) for f in fields(quiet)] == [
        ("Elastic", "1 GPU, batch 64 (gpus 1-4, batch size 64-512, profile learn); resized 0 times"),
        ("Samples/s", "none reported yet: it stays at its size until it calls fw.report(samples=...)"),
    ]
    talking = quiet.model_copy(
        update={"num_gpus": 2, "batch_size": 128, "resizes": 1, "speeds": {"2x128": 190.55, "1x64": 100.0}}
    )
    assert [(f.label, f.value) for f in fields(talking)][1] == (
        "Samples/s",
        "1 GPU x 64: 100/s, 2 GPUs x 128: 190.6/s",
    )


def test_a_mistyped_command_is_refused_naming_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sbumit", "--gpus", "1", "--", "true"]) == 2
    assert capsys.readouterr().err == (
        "fleet: no such command 'sbumit' (did you mean 'submit'?) (see `fleet --help`)\n"
    )
    assert main(["xyzzy"]) == 2
    assert capsys.readouterr().err == "fleet: no such command 'xyzzy' (see `fleet --help`)\n"


def test_a_config_file_that_is_not_there_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing, there = tmp_path / "flet.toml", tmp_path / "fleet.toml"
    there.write_text("")
    nowhere = ["--api-url", "http://127.0.0.1:1"]  # past the check, a command finds no API: exit 5
    assert main(["--config", str(missing), *nowhere, "jobs"]) == 2
    assert (
        capsys.readouterr().err
        == f"fleet: --config {missing}: no such file (give the path of a fleet.toml)\n"
    )
    monkeypatch.setenv("FLEET_CONFIG", str(missing))
    assert main([*nowhere, "jobs"]) == 2
    assert capsys.readouterr().err == (
        f"fleet: FLEET_CONFIG {missing}: no such file (unset it or name a fleet.toml)\n"
    )
    # a command's help is shown all the same (a unit file's --config names where it will be)
    assert main([*nowhere, "jobs", "--help"]) == 0
    # --config wins over FLEET_CONFIG, and a file that is there is taken
    assert main(["--config", str(there), *nowhere, "jobs"]) == 5


def test_fleet_show_gives_the_gpu_time_a_job_used_over_its_attempts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a job on 2 GPUs whose ended attempts ran 1.5 GPU-hours and whose current one began at t=0
    two = job(None).spec.model_copy(update={"gpus": 2})
    running = job(None).model_copy(
        update={"spec": two, "gpus": ["g0", "g1"], "used_gpu_s": 5400.0, "running_from": 0.0}
    )
    # Then `fleet show` at t=1,800 counts both: 1.5 + 2 x 0.5
    assert "GPU time:   2.50 GPU-hours, its attempts together\n" in plain(
        _job_view(running, now=1800.0), capsys
    )
    # And a job that never ran has no such line
    queued = job(None).model_copy(update={"state": JobState.QUEUED, "gpus": []})
    assert "GPU time" not in plain(_job_view(queued, now=1800.0), capsys)
