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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from fleet.errors import ConfigError

DAY = 86400.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class ControllerSettings(_Section):
    leader_lease_s: float = Field(default=5.0, gt=0)
    schedule_interval_s: float = Field(default=2.0, gt=0)
    #: the queue is kept in memory; this often it is compared with Redis (the truth) and mended
    resync_interval_s: float = Field(default=30.0, gt=0)
    worker_threads: int = Field(default=1, ge=1)
    metrics_port: int = Field(default=9400, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    scheduled_timeout_s: float = Field(default=60.0, gt=0, description="SCHEDULED longer: launch lost")
    starting_timeout_s: float = Field(default=1800.0, gt=0, description="STARTING longer: launch hung")
    retention_interval_s: float = Field(default=10.0, gt=0, description="how often expired records go")
    retention_batch: int = Field(default=500, ge=1, le=10_000, description="jobs deleted per Redis call")


class AgentSettings(_Section):
    node_name: str = Field(default_factory=socket.gethostname, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    node_lease_ttl_s: float = Field(default=10.0, gt=0)
    #: the supervisor kills every attempt this long before an unrenewed lease would expire
    fence_margin_s: float = Field(default=2.0, ge=0.2)
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
    #: what the node offers jobs (scheduled, not only limits); default: every core, all memory
    cpus: float | None = Field(default=None, gt=0)
    memory: int | None = Field(default=None, gt=0)
    job_user: str = Field(default="65534:65534", pattern=r"^\d{1,10}(:\d{1,10})?$", description="uid[:gid]")
    allow_root_jobs: bool = False
    pids_limit: int | None = Field(default=4096, ge=16)
    checkpoint_sweep_interval_s: float = Field(default=600.0, gt=0, description="expired jobs' dirs go")

    @model_validator(mode="after")
    def _can_fence_in_time(self) -> AgentSettings:
        """A lease renewed every heartbeat must survive one late heartbeat, and still leave the
        supervisor its margin to stop every attempt before the controller may requeue them."""
        needed = self.fence_margin_s + 2 * self.heartbeat_interval_s
        if self.node_lease_ttl_s < needed:
            raise ValueError(
                f"node_lease_ttl_s ({self.node_lease_ttl_s:g}) must be at least fence_margin_s "
                f"({self.fence_margin_s:g}) + 2 x heartbeat_interval_s ({self.heartbeat_interval_s:g}) = "
                f"{needed:g}: jobs are stopped fence_margin_s before an unrenewed lease expires, and one "
                "late heartbeat must not stop them"
            )
        return self


class Settings(BaseSettings):
    # defer_build: validators are built when settings are first loaded (a CLI command loads them
    # once, from Settings itself or from the subclass that names the config file), not at import
    model_config = SettingsConfigDict(
        env_prefix="FLEET_", env_nested_delimiter="__", extra="forbid", toml_file=None, defer_build=True
    )

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: SecretStr | None = None
    bus_db: int = Field(default=1, ge=0, le=15)
    #: safety net: an idle consumer, woken by each send, still fetches this often (see fleet.bus.wake)
    bus_poll_ms: int = Field(default=2000, ge=1, le=10_000)
    key_prefix: str = "fleet"
    default_image: str = "localhost/fleet/python:latest"
    checkpoint_root: Path = Path("/var/lib/fleet/checkpoints")
    allowed_mounts: list[Path] = Field(default_factory=list)
    log_max_lines: int = Field(default=10_000, ge=100)
    max_infra_requeues: int = Field(default=10, ge=0)
    retry_backoff_s: float = Field(default=5.0, ge=0)
    retry_backoff_max_s: float = Field(default=300.0, ge=0)
    job_retention_s: float = Field(default=7 * DAY, gt=0, description="ended jobs are deleted after")
    tombstone_retention_s: float = Field(default=7 * DAY, gt=0, description="`fleet show` says expired")
    node_retention_s: float = Field(default=7 * DAY, gt=0, description="gone nodes are removed after")
    bus_dead_message_ttl_s: float = Field(default=7 * DAY, gt=0)
    bus_dead_letters_max: int = Field(default=10_000, ge=1)
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
        """The Redis URL with the logical DB swapped in. Credentials are never spliced into it:
        :meth:`redis_password_for` passes them to the client separately, so a password holding
        ``@``, ``/`` or ``#`` cannot change which host is dialled."""
        parts = urlsplit(self.redis_url)
        path = parts.path if db is None else f"/{db}"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))

    def redis_password_for(self) -> str | None:
        """``redis_password`` (``FLEET_REDIS_PASSWORD``), else None: a password in the URL applies."""
        return self.redis_password.get_secret_value() if self.redis_password is not None else None

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

    source: type[Settings] = Settings
    if path is not None:

        class _FromFile(Settings):
            model_config = SettingsConfigDict(toml_file=path)

        source = _FromFile
    try:
        return source(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"invalid configuration ({path or 'environment'}): {problems}") from None
