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


def test_a_service_logs_in_as_its_acl_user_with_a_password_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the username from the environment and the password in a file (as systemd's LoadCredential)
    secret = tmp_path / "redis-password"
    secret.write_text("p@ss/w#rd\n")
    monkeypatch.setenv("FLEET_REDIS_USERNAME", "fleet-agent")
    monkeypatch.setenv("FLEET_REDIS_PASSWORD_FILE", str(secret))
    settings = load_settings()
    # Then both go to redis-py as keyword arguments, the file's line without its newline
    assert settings.redis_credentials() == {"username": "fleet-agent", "password": "p@ss/w#rd"}
    assert "p@ss" not in repr(settings) + settings.redis_url_for(1)
    # And a file the service cannot read is named, with why, at connect time
    secret.unlink()
    with pytest.raises(ConfigError, match=r"redis_password_file: cannot read .*redis-password: No such file"):
        settings.redis_credentials()


def test_a_password_from_both_the_environment_and_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_REDIS_PASSWORD", "a")
    monkeypatch.setenv("FLEET_REDIS_PASSWORD_FILE", str(tmp_path / "pw"))
    with pytest.raises(ConfigError, match="are both set: give one"):
        load_settings()


def test_no_credentials_means_the_default_user() -> None:
    assert load_settings().redis_credentials() == {}


def test_environment_names_are_case_insensitive_and_lists_or_sections_are_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a file with an agent section and variables: nested, whole-section JSON, a JSON list,
    # lower case, and FLEET_* ones that name no setting (a job's own, the config path)
    path = tmp_path / "fleet.toml"
    path.write_text('[agent]\nsimulated_gpus = 2\nruntime = "process"\n')
    monkeypatch.setenv("fleet_agent__simulated_gpus", "6")
    monkeypatch.setenv("FLEET_CONTROLLER", '{"leader_lease_s": 9}')
    monkeypatch.setenv("FLEET_ALLOWED_MOUNTS", '["/data", "/scratch"]')
    monkeypatch.setenv("FLEET_JOB_ID", "not-a-setting")

    # When settings are loaded, with an override of one more agent key
    settings = load_settings(path, agent={"stop_grace_s": 1})

    # Then every source counts, sections merge key by key, and the strangers are ignored
    assert (settings.agent.simulated_gpus, settings.agent.runtime, settings.agent.stop_grace_s) == (
        6,
        "process",
        1,
    )
    assert settings.controller.leader_lease_s == 9
    assert [str(p) for p in settings.allowed_mounts] == ["/data", "/scratch"]


def test_a_bad_value_from_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_AGENT__SIMULATED_GPUS", "many")
    with pytest.raises(ConfigError, match=r"agent\.simulated_gpus: Input should be a valid integer"):
        load_settings()
    monkeypatch.setenv("FLEET_ALLOWED_MOUNTS", "/data")
    with pytest.raises(ConfigError, match=r"FLEET_ALLOWED_MOUNTS: expected JSON"):
        load_settings()
    monkeypatch.delenv("FLEET_ALLOWED_MOUNTS")
    monkeypatch.setenv("FLEET_AGENT__SIMULATED_GPUS", "2")
    monkeypatch.setenv("FLEET_AGENT__HEARTBEAT_INTERVALL_S", "1")
    with pytest.raises(ConfigError, match=r"agent\.heartbeat_intervall_s: Extra inputs are not permitted"):
        load_settings()


def test_a_state_dir_too_long_for_the_supervisors_socket_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fits = "/s" * 45  # 90 bytes, 106 with /supervisor.sock
    monkeypatch.setenv("FLEET_AGENT__STATE_DIR", fits)
    assert str(load_settings().agent.state_dir) == fits
    monkeypatch.setenv("FLEET_AGENT__STATE_DIR", fits + "/x")
    with pytest.raises(ConfigError, match=r"agent\.state_dir: .*\(108 bytes .* pick a shorter directory"):
        load_settings()


def test_jobs_run_as_per_tenant_uids_by_default() -> None:
    agent = load_settings().agent
    assert (agent.job_user, agent.fixed_user, agent.uid_range) == (None, None, (1_000_000_000, 1_000_000))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0-99", "'0-99': expected START-END with 1 <= START <= END <= 4294967294 (uid 0 is root)"),
        ("500-499", "'500-499': expected START-END"),
        ("1-4294967295", "'1-4294967295': expected START-END"),
        ("1000", "agent.job_uid_range: must be a range of numbers FIRST-LAST"),
        ("-5-9", "agent.job_uid_range: must be a range of numbers FIRST-LAST"),
    ],
)
def test_a_bad_job_uid_range_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("FLEET_AGENT__JOB_UID_RANGE", value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert message in str(err.value)


def test_a_job_uid_range_gives_its_first_uid_and_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_AGENT__JOB_UID_RANGE", "0700-0799")
    agent = load_settings().agent
    assert (agent.job_uid_range, agent.uid_range) == ("700-799", (700, 100))


def test_a_fixed_job_user_is_one_persons_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_AGENT__JOB_USER", "1000")
    assert load_settings().agent.fixed_user == (1000, 1000)
    monkeypatch.setenv("FLEET_AGENT__JOB_USER", "")  # empty: per-tenant uids again
    assert load_settings().agent.fixed_user is None


@pytest.mark.parametrize("user", ["0", "0:0", "1000:0"])
def test_a_root_job_user_needs_allow_root_jobs(monkeypatch: pytest.MonkeyPatch, user: str) -> None:
    monkeypatch.setenv("FLEET_AGENT__JOB_USER", user)
    with pytest.raises(
        ConfigError, match=r"job_user '[0-9:]+' is root's \(uid or gid 0\): set allow_root_jobs"
    ):
        load_settings()
    monkeypatch.setenv("FLEET_AGENT__ALLOW_ROOT_JOBS", "true")
    assert 0 in (load_settings().agent.fixed_user or ())


@pytest.mark.parametrize("parent", ["../escape", "fleet/..", "/fleet", "fleet//x", "fleet x"])
def test_a_cgroup_parent_stays_below_the_cgroup_root(parent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_AGENT__CGROUP_PARENT", parent)
    with pytest.raises(ConfigError, match=r"agent\.cgroup_parent: "):
        load_settings()
    monkeypatch.setenv("FLEET_AGENT__CGROUP_PARENT", "fleet/jobs")
    assert load_settings().agent.cgroup_parent == "fleet/jobs"
