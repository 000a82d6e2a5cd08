"""Settings: defaults < fleet.toml < FLEET_* environment; credentials never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.config import load_settings
from fleet.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_fleet_toml_matches_the_defaults() -> None:
    assert load_settings(REPO / "config" / "fleet.toml").model_dump() == load_settings().model_dump()


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('default_image = "a"\n[agent]\nsimulated_gpus = 2\n')
    monkeypatch.setenv("FLEET_AGENT__SIMULATED_GPUS", "6")
    settings = load_settings(path)
    assert (settings.default_image, settings.agent.simulated_gpus) == ("a", 6)


def test_an_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("[agent]\nheartbeat_intervall_s = 1\n")
    with pytest.raises(ConfigError, match=r"agent\.heartbeat_intervall_s: Extra inputs are not permitted"):
        load_settings(path)


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope\.toml does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_password_comes_from_env_and_is_never_displayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://redis.internal:6379/0")
    monkeypatch.setenv("FLEET_REDIS_PASSWORD", "s3cret")
    settings = load_settings()
    assert settings.redis_url_for(1) == "redis://redis.internal:6379/1"
    assert settings.redis_password_for() == "s3cret"
    assert "s3cret" not in settings.redis_display + repr(settings)
    assert load_settings(redis_url="redis://u:pw@h:1/0").redis_display == "redis://u:***@h:1/0"
