"""Tenant policies are validated like job specs: a bad field is named, with what is allowed."""

from __future__ import annotations

import pytest

from fleet.errors import SpecError
from fleet.models import JobSpec, Tenant


def test_an_unconfigured_tenant_has_no_guarantee_no_limit_and_weight_one() -> None:
    tenant = Tenant(name="nlp")
    assert (tenant.guaranteed_gpus, tenant.max_gpus, tenant.weight) == (0, None, 1.0)
    assert (tenant.preempt_grace_s, tenant.min_run_s) == (120.0, 600.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "a/b"}, "name: String should match pattern"),
        ({"name": "a", "weight": 0}, "weight: Input should be greater than 0"),
        ({"name": "a", "guaranteed_gpus": -1}, "guaranteed_gpus: Input should be greater than or equal"),
        ({"name": "a", "guaranteed_gpus": 4, "max_gpus": 2}, "guaranteed_gpus (4) is above max_gpus (2)"),
        ({"name": "a", "guaranteed_cpus": 8, "max_cpus": 4}, "guaranteed_cpus (8) is above max_cpus (4)"),
        ({"name": "a", "guaranteed_memory": "2g", "max_memory": "1g"}, "guaranteed_memory (2147483648) is"),
        ({"name": "a", "quota": 2}, "quota: unknown field; allowed fields: guaranteed_cpus, guaranteed_gpus"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match="invalid tenant") as err:
        Tenant.parse(data)
    assert message in str(err.value)


def test_jobs_are_preemptible_unless_they_say_not() -> None:
    assert JobSpec(name="j", command=["x"]).preemptible
    assert not JobSpec(name="j", command=["x"], preemptible=False).preemptible
