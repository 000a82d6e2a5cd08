"""Which runtime an agent opens, and the lease timings it refuses to start with: pure checks."""

from __future__ import annotations

import pytest

from fleet.agent.runtime import choose
from fleet.config import load_settings
from fleet.errors import ConfigError


@pytest.mark.parametrize(
    ("configured", "recorded", "docker", "expected"),
    [
        ("auto", None, True, "docker"),  # Docker installed: never a silent fallback to processes
        ("auto", None, False, "process"),  # no Docker at all
        ("auto", "process", True, "process"),  # a restart keeps the runtime its attempts run under
        ("auto", "docker", False, "docker"),  # ... and fails loudly if Docker went away
        ("docker", "docker", True, "docker"),
        ("process", None, True, "process"),
    ],
)
def test_the_runtime_is_the_recorded_one_or_docker_where_installed(
    configured: str, recorded: str | None, docker: bool, expected: str
) -> None:
    assert choose(configured, recorded, docker) == expected


def test_switching_runtime_under_running_attempts_is_an_error_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"attempts ran under the process runtime .* delete that file"):
        choose("docker", "process", True)


def test_lease_timings_that_cannot_fence_in_time_are_refused() -> None:
    # a 3 s lease renewed every second leaves no room for a 2 s fence margin and one late heartbeat
    with pytest.raises(ConfigError, match=r"node_lease_ttl_s \(3\) must be at least fence_margin_s \(2\)"):
        load_settings(agent={"node_lease_ttl_s": 3, "heartbeat_interval_s": 1, "fence_margin_s": 2})
    assert load_settings(agent={"node_lease_ttl_s": 3, "heartbeat_interval_s": 0.25, "fence_margin_s": 0.5})
