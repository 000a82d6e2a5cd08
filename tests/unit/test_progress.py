"""Progress lines: what fleet_worker.progress prints is what fleet reads back and draws."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.models import Progress
from fleet.progress import bar, follows_batch, label, last_report, parse_line
from fleet_worker.signals import progress


def test_the_sdk_line_is_read_back_with_its_total_and_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    progress(450, total=1200, loss=0.125, samples_s=810)
    line = capsys.readouterr().out.strip()
    report = parse_line(line, now=1.0)
    assert report is not None and (report.step, report.total, report.metrics) == (
        450,
        1200,
        {"loss": 0.125, "samples_s": 810.0},
    )
    assert report.at > 1.0  # the job's own clock
    assert (
        label(report) == "38%"
        and bar(report, width=8) == "[###-----]  38% step 450/1200 loss=0.125 samples_s=810"
    )


def test_without_a_total_it_is_a_step_count() -> None:
    report = parse_line('fleet-progress {"step": 1200}', now=5.0)
    assert report == Progress(step=1200, at=5.0)
    assert label(report) == "step 1200" and bar(report) == "step 1200" and label(None) == "-"


@pytest.mark.parametrize(
    "line",
    [
        "step 5 loss 0.1",  # not a progress line
        "fleet-progress not json",
        'fleet-progress {"total": 10}',  # no step
        'fleet-progress {"step": -1}',
        'fleet-progress {"step": 1.5}',
        'fleet-progress {"step": 1, "total": 0}',
        "fleet-progress [1, 2]",
    ],
)
def test_a_line_that_is_not_a_readable_report_is_ignored(line: str) -> None:
    assert parse_line(line, now=0.0) is None


def test_the_newest_readable_report_wins_and_odd_metrics_are_dropped() -> None:
    lines = [
        'fleet-progress {"step": 1}',
        "chatter",
        'fleet-progress {"step": 2, "note": "x", "lr": 1e-3}',
        "x",
    ]
    report = last_report(lines, now=0.0)
    assert report is not None and report.step == 2 and report.metrics == {"lr": 0.001}


def test_a_job_that_follows_its_batch_reads_it_again_and_its_reports_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet_worker import env
    from fleet_worker.signals import report

    # Given an elastic attempt launched at batch 64, its control folder saying the same
    (tmp_path / "batch_size").write_text("64\n")
    monkeypatch.setenv("FLEET_BATCH_SIZE", "64")
    monkeypatch.setenv("FLEET_CONTROL_DIR", str(tmp_path))
    monkeypatch.setattr(env, "_followed", None)
    # A job that only reads its batch at start reports no promise to follow
    assert env.batch_size(32) == 64
    report(samples=0)
    assert not follows_batch(parse_line(capsys.readouterr().out.strip(), now=1.0))
    # When it follows, and fleet changes its batch to 256 where it runs
    assert env.batch_size(32, follow=True) == 64
    (tmp_path / "batch_size").write_text("256\n")
    # Then the next read gives 256, and its reports say it follows, at 256
    assert env.batch_size(32, follow=True) == 256
    report(samples=0)
    found = parse_line(capsys.readouterr().out.strip(), now=1.0)
    assert follows_batch(found) and found is not None and found.metrics["batch_size"] == 256
    # And a file it cannot read (half a write is never seen: fleet replaces it) keeps the last one
    (tmp_path / "batch_size").write_text("")
    assert env.batch_size(32, follow=True) == 256
    # Outside an elastic attempt of fleet's, no promise is reported: nothing could change it
    monkeypatch.delenv("FLEET_CONTROL_DIR")
    report(samples=0)
    assert not follows_batch(parse_line(capsys.readouterr().out.strip(), now=1.0))
