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
        ({"name": "a/b"}, "name: must be 1 to 63 letters, digits"),
        ({"name": "a", "weight": 0}, "weight: Input should be greater than 0"),
        ({"name": "a", "guaranteed_gpus": -1}, "guaranteed_gpus: Input should be greater than or equal"),
        ({"name": "a", "guaranteed_gpus": 4, "max_gpus": 2}, "guaranteed_gpus (4) is above max_gpus (2)"),
        ({"name": "a", "guaranteed_cpus": 8, "max_cpus": 4}, "guaranteed_cpus (8) is above max_cpus (4)"),
        ({"name": "a", "guaranteed_memory": "2g", "max_memory": "1g"}, "guaranteed_memory (2147483648) is"),
        ({"name": "a", "quota": 2}, "quota: unknown field; allowed fields: allowed_users, guaranteed_cpus"),
        ({"name": "a", "allowed_users": ["65534:0"]}, "allowed_users: 65534:0: gid 0 is root's group"),
        ({"name": "a", "allowed_users": ["102"]}, "allowed_users: '102': expected \"uid:gid\""),
        (
            {"name": "a", "allowed_users": ["1:4294967295"]},
            'expected "uid:gid", two numbers up to 4294967294',
        ),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match="invalid tenant") as err:
        Tenant.parse(data)
    assert message in str(err.value)


def test_jobs_are_preemptible_unless_they_say_not() -> None:
    assert JobSpec(name="j", command=["x"]).preemptible
    assert not JobSpec(name="j", command=["x"], preemptible=False).preemptible


def test_allowed_users_are_kept_once_each_in_their_normal_form() -> None:
    tenant = Tenant(name="a", allowed_users=["0102:105", "7:7", "102:105"])
    assert tenant.allowed_users == ["7:7", "102:105"]


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ("102:105", "user '102:105': tenant vision's jobs may not run as host user 102:105; drop `user`"),
        (
            "102:105",
            "ask an admin to allow it for the tenant: `fleet tenant set vision --allow-user 102:105`",
        ),
        ("7", "user '7': tenant vision's jobs may not run as host user 7:7"),
        ("65534:0", "user '65534:0': gid 0 is root's group and never allowed; drop `user`"),
        ("7:0", "gid 0 is root's group"),
    ],
)
def test_a_user_off_the_tenants_allow_list_is_refused_with_the_fix(user: str, message: str) -> None:
    tenant = Tenant(name="vision", allowed_users=["7:8", "1000:1000"])
    with pytest.raises(SpecError) as err:
        tenant.check_user(user)
    assert message in str(err.value)


def test_an_allow_listed_user_is_given_as_uid_and_gid() -> None:
    tenant = Tenant(name="vision", allowed_users=["7:8", "1000:1000"])
    assert (tenant.check_user("7:8"), tenant.check_user("1000"), tenant.check_user("01000:1000")) == (
        (7, 8),
        (1000, 1000),
        (1000, 1000),
    )
