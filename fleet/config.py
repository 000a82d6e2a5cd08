"""Settings: defaults < TOML file (``--config`` / ``FLEET_CONFIG``) < ``FLEET_*`` environment.

Nested keys come from the environment with ``__``: ``FLEET_AGENT__NODE_NAME=gpu-01``; names are
case-insensitive, a list or a whole section is given as JSON, and ``FLEET_*`` variables that name
no setting (``FLEET_CONFIG``, a job's ``FLEET_JOB_ID``) are left alone, but an unknown key of a
section (``FLEET_AGENT__HEARTBEAT_INTERVALL_S``) is an error naming it, as in the file. ``config/fleet.toml``
documents every key with its default; keep the two in step. The ``[controller]``, ``[agent]``
and ``[api]`` sections are in :mod:`fleet.config_sections`.

The sources are merged here, in a few lines, rather than by pydantic-settings: importing it cost
every ``fleet`` command ~30 ms (an eighth of ``fleet submit``) for these three rules.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from fleet.config_sections import DAY, AgentSettings, ApiSettings, ControllerSettings
from fleet.errors import ConfigError
from fleet.models.base import in_words


class Settings(BaseModel):
    # defaults validated too (a host name may not be a node name); validators built on first load
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    #: the Redis ACL user (fleet-controller, fleet-agent, fleet-api: config/users.acl); None: default
    redis_username: str | None = Field(default=None, pattern=r"^[!-~]{1,128}$")
    redis_password: SecretStr | None = None
    #: a file whose one line is the password, read when a service connects (systemd's LoadCredential)
    redis_password_file: Path | None = None
    #: Redis Sentinel: the sentinels' ``host:port`` (from the environment, comma-separated). Set, the
    #: primary is whichever Redis they name ``redis_master``, asked again after every failover;
    #: ``redis_url`` then gives only the DB number (and its user, if it names one)
    redis_sentinels: list[str] = Field(default_factory=list, max_length=32)
    redis_master: str = Field(default="fleet", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    #: the sentinels' own login, if they have one (``requirepass`` / ACL in sentinel.conf)
    redis_sentinel_username: str | None = Field(default=None, pattern=r"^[!-~]{1,128}$")
    redis_sentinel_password: SecretStr | None = None
    redis_sentinel_password_file: Path | None = None
    #: replicas that must hold a write before fleet acknowledges it (``WAIT``); None: 1 with
    #: sentinels, 0 without (see :mod:`fleet.state.replication`)
    redis_replicas_ack: int | None = Field(default=None, ge=0, le=16)
    #: how long an acknowledged write waits for them before it is answered "not replicated yet";
    #: below the 5 s socket timeout of every connection, so WAIT answers before the socket gives up
    redis_replicas_ack_timeout_ms: int = Field(default=1000, ge=10, le=4000)
    bus_db: int = Field(default=1, ge=0, le=15)
    #: safety net: an idle consumer, woken by each send, still fetches this often (see fleet.bus.wake)
    bus_poll_ms: int = Field(default=2000, ge=1, le=10_000)
    key_prefix: str = "fleet"
    default_image: str = "localhost/fleet/python:latest"
    #: registries jobs' images may come from ("docker.io" for names without one; "*": any)
    allowed_registries: list[str] = Field(
        default_factory=lambda: ["localhost", "docker.io", "nvcr.io", "ghcr.io"]
    )
    checkpoint_root: Path = Path("/var/lib/fleet/checkpoints")
    allowed_mounts: list[Path] = Field(default_factory=list)
    #: networks webhooks may be sent to besides public addresses (loopback, private, link-local and
    #: the like are refused otherwise: a webhook must not reach the fleet's own or the cloud's services)
    webhook_allowed_networks: list[str] = Field(default_factory=list)
    log_max_lines: int = Field(default=10_000, ge=100)
    #: a longer line is cut to this many bytes, saying how many were cut
    log_max_line_bytes: int = Field(default=16 << 10, ge=256, le=1 << 20)
    #: about this many bytes of an attempt's output are kept (its last lines), however long they are
    log_max_bytes: int = Field(default=16 << 20, ge=64 << 10, le=1 << 30)
    #: a directory shipped with a job (``--workdir``), packed: at most this many bytes
    workdir_max_bytes: int = Field(default=64 << 20, ge=1 << 10, le=1 << 30)
    #: how long a shipped directory is kept after its last upload or submit (a function's call: as
    #: long as the jobs that name it)
    workdir_retention_s: float = Field(default=7 * DAY, gt=0)
    #: what one tenant's uploads (shipped directories, profiles) may hold in Redis at once
    blob_quota_bytes: int = Field(default=1 << 30, ge=1 << 20)
    #: what one tenant's kept job outputs (spec ``outputs``) may hold on checkpoint_root at once,
    #: unless the tenant's ``outputs_quota`` says otherwise
    outputs_quota_bytes: int = Field(default=10 << 30, ge=0)
    #: the group that may read kept outputs and checkpoints on checkpoint_root (the API's, which
    #: serves ``fleet download``; ``fleet install`` makes it). A node where it does not exist, or
    #: "": root's alone (0700), as the API cannot read them unless it runs as root
    storage_group: str = Field(default="fleet", pattern=r"^([a-z_][a-z0-9_-]{0,31})?$")
    max_infra_requeues: int = Field(default=10, ge=0)
    retry_backoff_s: float = Field(default=5.0, ge=0)
    retry_backoff_max_s: float = Field(default=300.0, ge=0)
    job_retention_s: float = Field(default=7 * DAY, gt=0, description="ended jobs are deleted after")
    tombstone_retention_s: float = Field(default=7 * DAY, gt=0, description="`fleet show` says expired")
    node_retention_s: float = Field(default=7 * DAY, gt=0, description="gone nodes are removed after")
    accounting_retention_s: float = Field(
        default=400 * DAY, gt=0, description="`fleet history` rows of ended jobs are kept for"
    )
    bus_dead_message_ttl_s: float = Field(default=7 * DAY, gt=0)
    bus_dead_letters_max: int = Field(default=10_000, ge=1)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"{network!r} is not a network (e.g. 10.0.0.0/8 or 127.0.0.1/32)") from None
        return value

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``FLEET_REDIS_SENTINELS="10.0.0.1:26379,10.0.0.2:26379"``; the TOML file gives a list."""
        return (
            [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value
        )

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinel_addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            host_port(entry)
        return value

    @model_validator(mode="after")
    def _one_password_source(self) -> Settings:
        for name in ("redis", "redis_sentinel"):
            if getattr(self, f"{name}_password") is not None and getattr(self, f"{name}_password_file"):
                env = f"FLEET_{name.upper()}_PASSWORD"
                raise ValueError(
                    f"{name}_password ({env}) and {name}_password_file ({env}_FILE) are both set: give one"
                )
        return self

    @model_validator(mode="after")
    def _sentinel_only_with_sentinels(self) -> Settings:
        given = [name for name in _SENTINEL_LOGIN if getattr(self, name) is not None]
        if given and not self.redis_sentinels:
            raise ValueError(
                f"{given[0]} is set but redis_sentinels (FLEET_REDIS_SENTINELS) is empty: list the "
                "sentinels as host:port, or unset it"
            )
        if self.redis_sentinels and urlsplit(self.redis_url).scheme != "redis":
            raise ValueError(
                f"redis_url {redact(self.redis_url)!r}: with redis_sentinels it must be a redis:// URL (its "
                "DB number and user apply; the sentinels say which host is the primary), e.g. "
                "redis://127.0.0.1:6379/0; TLS and unix sockets are not supported with Sentinel"
            )
        return self

    def redis_url_for(self, db: int | None = None) -> str:
        """The Redis URL with the logical DB swapped in. Credentials are never spliced into it:
        :meth:`redis_password_for` passes them to the client separately, so a password holding
        ``@``, ``/`` or ``#`` cannot change which host is dialled."""
        parts = urlsplit(self.redis_url)
        path = parts.path if db is None else f"/{db}"
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))

    def redis_password_for(self) -> str | None:
        """``redis_password`` (``FLEET_REDIS_PASSWORD``), or the one line of ``redis_password_file``,
        else None: a password in the URL applies."""
        if self.redis_password_file is not None:
            return read_secret(self.redis_password_file, "redis_password_file")
        return self.redis_password.get_secret_value() if self.redis_password is not None else None

    def redis_credentials(self) -> dict[str, str]:
        """``username`` and ``password`` keyword arguments for redis-py, those that are set. Given
        apart from the URL, never spliced into it; a username or password the URL holds wins."""
        found = {"username": self.redis_username, "password": self.redis_password_for()}
        return {name: value for name, value in found.items() if value is not None}

    def replicas_ack(self) -> int:
        """How many replicas each acknowledged write waits for (``redis_replicas_ack``, resolved)."""
        if self.redis_replicas_ack is not None:
            return self.redis_replicas_ack
        return 1 if self.redis_sentinels else 0

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [host_port(entry) for entry in self.redis_sentinels]

    def sentinel_credentials(self) -> dict[str, str]:
        """``username`` and ``password`` for the sentinels themselves, those that are set."""
        password = self.redis_sentinel_password
        if self.redis_sentinel_password_file is not None:
            secret: str | None = read_secret(
                self.redis_sentinel_password_file, "redis_sentinel_password_file"
            )
        else:
            secret = password.get_secret_value() if password is not None else None
        found = {"username": self.redis_sentinel_username, "password": secret}
        return {name: value for name, value in found.items() if value is not None}

    @property
    def redis_display(self) -> str:
        if self.redis_sentinels:
            sentinels = ",".join(self.redis_sentinels)
            return f"{redact(self.redis_url)} primary {self.redis_master} of sentinels {sentinels}"
        return redact(self.redis_url)


#: the settings of the sentinels' own login
_SENTINEL_LOGIN = ("redis_sentinel_username", "redis_sentinel_password", "redis_sentinel_password_file")


def host_port(entry: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as (host, port); a ValueError says what was expected."""
    host, _, port = entry.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"{entry!r} is not host:port: list each sentinel as host:port, e.g. "
            'FLEET_REDIS_SENTINELS="10.0.0.1:26379,10.0.0.2:26379" or '
            'redis_sentinels = ["10.0.0.1:26379", "10.0.0.2:26379"] in fleet.toml'
        )
    return host, int(port)


_HOST = re.compile(r"[A-Za-z0-9:][A-Za-z0-9.:_-]{0,252}")


def read_secret(path: Path, setting: str) -> str:
    """The one line of a secret file; errors name the file, never what it holds."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    secret = text.rstrip("\r\n")
    if not secret or "\n" in secret or "\x00" in secret:
        raise ConfigError(f"{setting}: {path} must hold one line, the password")
    return secret


def redact(url: str) -> str:
    """``url`` with any password replaced, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


ENV_PREFIX = "FLEET_"

#: settings that hold a whole section, and lists: from the environment they are JSON
_SECTIONS: dict[str, type[BaseModel]] = {
    "controller": ControllerSettings,
    "agent": AgentSettings,
    "api": ApiSettings,
}
_LISTS = frozenset({"allowed_mounts", "webhook_allowed_networks", "allowed_registries"})


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``config`` (or ``$FLEET_CONFIG``), the environment and ``overrides``."""
    path = config or os.environ.get("FLEET_CONFIG") or None
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {path} does not exist (set --config or FLEET_CONFIG to a fleet.toml)")
    try:
        data = _toml(path)
        _merge(data, from_env(os.environ))
        _merge(data, {k: v for k, v in overrides.items() if v is not None})
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {_said(e)}" for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"invalid configuration ({path or 'environment'}): {problems}") from None


def _said(error: Any) -> str:
    """A setting's error, a pattern said in words (what the value may hold)."""
    if error["type"] == "string_pattern_mismatch":
        return (
            f"must be {in_words(str(error.get('ctx', {}).get('pattern', '')))} (got {error.get('input')!r})"
        )
    return str(error["msg"])


def _toml(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid configuration ({path}): not TOML: {exc}") from None


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings ``FLEET_*`` variables give, nested: ``FLEET_AGENT__NODE_NAME=a`` is
    ``{"agent": {"node_name": "a"}}``. pydantic turns the strings into numbers, paths and flags."""
    found: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        key, _, sub = name[len(ENV_PREFIX) :].lower().partition("__")
        field = Settings.model_fields.get(key)
        if field is None:
            continue
        section = _SECTIONS.get(key)
        if not sub:
            found[key] = _json(name, value) if section or key in _LISTS else value
        elif section is not None:  # an unknown key of a section is an error, as in the file
            found.setdefault(key, {})[sub] = value
    return found


def _json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        raise ConfigError(f"invalid configuration (environment): {name}: expected JSON") from None


def _merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    """Deep-merge ``update`` into ``into``: a section given by two sources keeps the keys of both."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value
