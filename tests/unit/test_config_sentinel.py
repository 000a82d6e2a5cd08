"""Settings of Redis Sentinel: the sentinels' addresses, the primary's name, the sentinels' login."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.config import load_settings
from fleet.errors import ConfigError


def test_sentinels_come_from_the_environment_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "10.0.0.1:26379, sentinel-b:26380,[::1]:26381")
    monkeypatch.setenv("FLEET_REDIS_MASTER", "jobs")
    settings = load_settings()
    assert settings.sentinel_addresses() == [("10.0.0.1", 26379), ("sentinel-b", 26380), ("::1", 26381)]
    assert settings.redis_master == "jobs"
    assert "jobs of sentinels 10.0.0.1:26379" in settings.redis_display


def test_sentinels_come_from_the_file_as_a_list(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('redis_sentinels = ["a:26379", "b:26379"]\n')
    assert load_settings(path).sentinel_addresses() == [("a", 26379), ("b", 26379)]


@pytest.mark.parametrize("bad", ["sentinel-a", "sentinel-a:", "a:26379,b:port", "a:0", "a:70000", ":26379"])
def test_a_sentinel_that_is_not_host_port_is_named_with_the_fix(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", bad)
    with pytest.raises(ConfigError, match=r"redis_sentinels: .* is not host:port: .*FLEET_REDIS_SENTINELS="):
        load_settings()


def test_a_master_name_with_spaces_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_MASTER", "my master")
    with pytest.raises(ConfigError, match=r"redis_master: must be"):
        load_settings()


def test_the_sentinels_password_comes_from_a_file_and_is_never_displayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "sentinel-password"
    secret.write_text("s3nt#nel\n")
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "a:26379")
    monkeypatch.setenv("FLEET_REDIS_SENTINEL_USERNAME", "fleet-sentinel")
    monkeypatch.setenv("FLEET_REDIS_SENTINEL_PASSWORD_FILE", str(secret))
    settings = load_settings()
    assert settings.sentinel_credentials() == {"username": "fleet-sentinel", "password": "s3nt#nel"}
    assert settings.redis_credentials() == {}  # the primary's login is its own
    assert "s3nt" not in repr(settings) + settings.redis_display


def test_a_sentinel_password_without_sentinels_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_SENTINEL_PASSWORD", "x")
    with pytest.raises(ConfigError, match=r"redis_sentinel_password is set but redis_sentinels .* is empty"):
        load_settings()


def test_a_sentinel_password_from_both_the_environment_and_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "a:26379")
    monkeypatch.setenv("FLEET_REDIS_SENTINEL_PASSWORD", "x")
    monkeypatch.setenv("FLEET_REDIS_SENTINEL_PASSWORD_FILE", str(tmp_path / "p"))
    with pytest.raises(
        ConfigError, match=r"redis_sentinel_password .* and redis_sentinel_password_file .* give one"
    ):
        load_settings()


@pytest.mark.parametrize("url", ["rediss://redis.internal:6379/0", "unix:///run/redis.sock"])
def test_sentinels_need_a_plain_redis_url(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "a:26379")
    monkeypatch.setenv("FLEET_REDIS_URL", url)
    with pytest.raises(ConfigError, match=r"with redis_sentinels it must be a redis:// URL"):
        load_settings()


def test_acknowledged_writes_wait_for_one_replica_with_sentinels_and_none_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given no redis_replicas_ack: a plain Redis has no replica to wait for, a sentinel set has one
    assert load_settings().replicas_ack() == 0
    monkeypatch.setenv("FLEET_REDIS_SENTINELS", "10.0.0.1:26379")
    assert load_settings().replicas_ack() == 1
    # When the operator asks for two, or for none (replicas that lag far behind, a choice made knowingly)
    monkeypatch.setenv("FLEET_REDIS_REPLICAS_ACK", "2")
    assert load_settings().replicas_ack() == 2
    monkeypatch.setenv("FLEET_REDIS_REPLICAS_ACK", "0")
    assert load_settings().replicas_ack() == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLEET_REDIS_REPLICAS_ACK", "-1"),
        ("FLEET_REDIS_REPLICAS_ACK_TIMEOUT_MS", "0"),
        ("FLEET_REDIS_REPLICAS_ACK_TIMEOUT_MS", "5000"),
    ],
)
def test_a_replica_count_or_timeout_out_of_range_is_refused(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # WAIT with a timeout of 0 blocks for ever, and one past the socket timeout (5 s) is cut off by it:
    # a write must be answered, replicated or not
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name.removeprefix("FLEET_").lower()):
        load_settings()


def test_not_replicated_is_a_retryable_503_the_client_raises_as_itself() -> None:
    # Given an acknowledged write the replicas did not take in time
    from fleet.api.app import status_of
    from fleet.client.transport import error_named
    from fleet.errors import NotReplicated, error_body

    error = NotReplicated("not replicated yet: the submit of job j reached the Redis primary; retry")
    # Then the API answers 503, and the client raises it as itself: retryable, exit code 5
    body = error_body(error)
    assert status_of(error) == 503 and body["exit_code"] == 5
    again = error_named(body["error"], body["detail"])
    assert type(again) is NotReplicated and again.retryable and "retry" in str(again)
