"""Progress lines: what fleet_worker.progress prints is what fleet reads back and draws."""

from __future__ import annotations

import pytest

from fleet.models import Progress
from fleet.progress import bar, label, last_report, parse_line
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
