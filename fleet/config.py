"""Settings: defaults < TOML file (``--config`` / ``FLEET_CONFIG``) < ``FLEET_*`` environment.

Nested keys come from the environment with ``__``: ``FLEET_AGENT__NODE_NAME=gpu-01``.
``config/fleet.toml`` documents every key with its default; keep the two in step.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fleet.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ControllerSettings(_Section):
    leader_lease_s: float = Field(default=5.0, gt=0)
    schedule_interval_s: float = Field(default=2.0, gt=0)
    worker_threads: int = Field(default=1, ge=1)
    metrics_port: int = Field(default=9400, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    scheduled_timeout_s: float = Field(default=60.0, gt=0, description="SCHEDULED longer: launch lost")
    starting_timeout_s: float = Field(default=1800.0, gt=0, description="STARTING longer: launch hung")


class AgentSettings(_Section):
    node_name: str = Field(default_factory=socket.gethostname)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    node_lease_ttl_s: float = Field(default=10.0, gt=0)
    reconcile_interval_s: float = Field(default=2.0, gt=0)
    gpus: Literal["auto", "nvml", "simulated"] = "auto"
    simulated_gpus: int = Field(default=4, ge=0)
    simulated_gpu_model: str = "Simulated A100 80GB"
    simulated_gpu_memory: int = 80 * (1 << 30)
    gpu_busy_memory: int = Field(default=1 << 30, description="bytes used above which a GPU counts as busy")
    gpu_release_timeout_s: float = Field(default=10.0, ge=0)
    metrics_port: int = Field(default=9401, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    runtime: Literal["auto", "docker", "process"] = "auto"
    state_dir: Path = Path("/var/lib/fleet/agent")
    docker_pull: Literal["never", "missing"] = "missing"
    stop_grace_s: float = Field(default=30.0, ge=0)
    worker_threads: int = Field(default=4, ge=1)
    stop_jobs_on_exit: bool = Field(default=False, description="`fleet up` sets it; systemd agents keep jobs")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEET_", env_nested_delimiter="__", extra="forbid", toml_file=None
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: SecretStr | None = None
    bus_db: int = Field(default=1, ge=0, le=15)
    bus_poll_ms: int = Field(default=20, ge=1, le=10_000)
    key_prefix: str = "fleet"
    default_image: str = "fleet/python"
    checkpoint_root: Path = Path("/var/lib/fleet/checkpoints")
    allowed_mounts: list[Path] = Field(default_factory=list)
    log_max_lines: int = Field(default=10_000, ge=100)
    max_infra_requeues: int = Field(default=10, ge=0)
    retry_backoff_s: float = Field(default=5.0, ge=0)
    retry_backoff_max_s: float = Field(default=300.0, ge=0)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    def redis_url_for(self, db: int | None = None) -> str:
        """The Redis URL with the password from ``redis_password`` and the logical DB swapped in."""
        parts = urlsplit(self.redis_url)
        netloc = parts.netloc
        if self.redis_password is not None and "@" not in netloc:
            netloc = f":{self.redis_password.get_secret_value()}@{netloc}"
        path = parts.path if db is None else f"/{db}"
        return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))

    @property
    def redis_display(self) -> str:
        return redact(self.redis_url)


def redact(url: str) -> str:
    """``url`` with any password replaced, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``config`` (or ``$FLEET_CONFIG``), the environment and ``overrides``."""
    path = config or os.environ.get("FLEET_CONFIG") or None
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {path} does not exist (set --config or FLEET_CONFIG to a fleet.toml)")

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    try:
        return _FromFile(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"invalid configuration ({path or 'environment'}): {problems}") from None
