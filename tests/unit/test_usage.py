"""Accounting's sums and periods (``fleet.models.usage``): what ``fleet history`` adds up."""

from __future__ import annotations

from datetime import datetime

import pytest

from fleet.errors import SpecError
from fleet.models.usage import UsageRow, aggregate, parse_when, total


def row(job_id: str, tenant: str, user: str, state: str, gpu_s: float, run_s: float = 10.0) -> UsageRow:
    return UsageRow(
        id=job_id,
        tenant=tenant,
        user=user,
        state=state,
        ended_at=1000.0,
        gpu_s=gpu_s,
        run_s=run_s,
        cpu_s=run_s * 4,
    )


ROWS = [
    row("a", "vision", "alice", "SUCCEEDED", 3600),
    row("b", "vision", "alice", "FAILED", 7200),
    row("c", "vision", "carol", "CANCELLED", 0),
    row("d", "nlp", "bob", "SUCCEEDED", 36000),
]


def test_rows_are_summed_per_tenant_and_user_most_gpu_hours_first() -> None:
    found = aggregate(ROWS, "user")
    assert [(u.tenant, u.user, u.jobs, u.succeeded, u.failed, u.cancelled, u.gpu_s) for u in found] == [
        ("nlp", "bob", 1, 1, 0, 0, 36000),
        ("vision", "alice", 2, 1, 1, 0, 10800),
        ("vision", "carol", 1, 0, 0, 1, 0),
    ]
    assert found[1].run_s == 20 and found[1].cpu_s == 80


def test_rows_are_summed_per_tenant_without_users() -> None:
    found = aggregate(ROWS, "tenant")
    assert [(u.tenant, u.user, u.jobs, u.gpu_s) for u in found] == [
        ("nlp", None, 1, 36000),
        ("vision", None, 3, 10800),
    ]
    assert (total(found).jobs, total(found).gpu_s, total(found).cancelled) == (4, 46800, 1)


def test_no_rows_sum_to_nothing() -> None:
    assert aggregate([], "user") == []
    assert total([]).jobs == 0


@pytest.mark.parametrize(
    ("text", "back_s"),
    [("30d", 30 * 86400), ("12h", 12 * 3600), ("2w", 14 * 86400), ("90m", 5400), ("45s", 45)],
)
def test_a_span_is_counted_back_from_now(text: str, back_s: float) -> None:
    assert parse_when(text, 1e9, "--since") == 1e9 - back_s


def test_an_iso_date_is_a_point_in_local_time() -> None:
    assert parse_when("2025-01-31", 0, "--until") == datetime(2025, 1, 31).timestamp()
    assert parse_when("2025-01-31T08:00:00+00:00", 0, "--until") == 1738310400


@pytest.mark.parametrize("text", ["30 days", "yesterday", "-3d", "", "3y"])
def test_a_period_it_cannot_read_names_the_flag_and_the_forms(text: str) -> None:
    with pytest.raises(SpecError, match=r"--since .*30d.*2025-01-31"):
        parse_when(text, 1e9, "--since")
