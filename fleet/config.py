"""Settings: defaults < TOML file (``--config`` / ``FLEET_CONFIG``) < ``FLEET_*`` environment.

Nested keys come from the environment with ``__``: ``FLEET_AGENT__NODE_NAME=gpu-01``; names are
case-insensitive, a list or a whole section is given as JSON, and ``FLEET_*`` variables that name
no setting (``FLEET_CONFIG``, a job's ``FLEET_JOB_ID``) are left alone, but an unknown key of a
section (``FLEET_AGENT__HEARTBEAT_INTERVALL_S``) is an error naming it, as in the file. ``config/fleet.toml``
documents every key with its default; keep the two in step.

The sources are merged here, in a few lines, rather than by pydantic-settings: importing it cost
every ``fleet`` command ~30 ms (an eighth of ``fleet submit``) for these three rules.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
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

from fleet.errors import ConfigError
from fleet.models.base import Size

DAY = 86400.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)


class ControllerSettings(_Section):
    leader_lease_s: float = Field(default=5.0, gt=0)
    schedule_interval_s: float = Field(default=2.0, gt=0)
    #: the queue is kept in memory; this often it is compared with Redis (the truth) and mended
    resync_interval_s: float = Field(default=30.0, gt=0)
    worker_threads: int = Field(default=1, ge=1)
    metrics_port: int = Field(default=9400, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    #: where /metrics listens: it has no authentication, so loopback unless an operator opens it
    metrics_address: str = Field(default="127.0.0.1", max_length=253, pattern=r"^[A-Za-z0-9.:_-]+$")
    scheduled_timeout_s: float = Field(default=60.0, gt=0, description="SCHEDULED longer: launch lost")
    starting_timeout_s: float = Field(
        default=1800.0, gt=0,
        description="STARTING longer: launch hung (a multi-node job is STARTING until every member runs)",
    )  # fmt: skip
    #: the ports a multi-node job's rank 0 may listen on (MASTER_PORT), one per gang on a node
    rendezvous_port_base: int = Field(default=29400, ge=1024, le=65535)
    rendezvous_ports: int = Field(default=500, ge=1, le=10_000)
    #: the node label whose value groups nodes close to each other (a rack, a switch): a
    #: multi-node job goes to nodes of one group when one group can hold it
    topology_label: str = Field(default="rack", max_length=64)
    #: fair share counts past GPU use with each second's weight halving this often (Slurm's
    #: PriorityDecayHalfLife); the leader folds the allocation into it every usage_interval_s
    fair_share_half_life_s: float = Field(default=7 * DAY, gt=0)
    usage_interval_s: float = Field(default=10.0, gt=0, description="also how often tenants are re-read")
    #: stop jobs of tenants above their fair share for a tenant below its guarantee (and, within a
    #: tenant, lower-priority jobs for higher-priority ones)
    preemption: bool = True
    #: size elastic jobs (gpus: {min, max}) with the elastic allocator, and resize them while they run;
    #: off: each starts at its smallest size and keeps it (``fleet resize`` still changes it)
    elastic: bool = True
    #: how often the elastic step runs when nothing changed (a change runs it at the next pass)
    elastic_interval_s: float = Field(default=10.0, gt=0)
    #: no elastic job is resized again sooner than this after it started or was resized
    elastic_min_interval_s: float = Field(default=120.0, ge=0)
    #: what one resize costs a job (SIGTERM, checkpoint, requeue, restart, restore): a resize is made
    #: only when the throughput it gains outweighs it
    resize_cost_s: float = Field(default=30.0, ge=0)
    retention_interval_s: float = Field(default=10.0, gt=0, description="how often expired records go")
    retention_batch: int = Field(default=500, ge=1, le=10_000, description="jobs deleted per Redis call")
    #: webhooks: how often ended jobs and node changes become deliveries, and how they are sent
    webhook_interval_s: float = Field(default=1.0, gt=0, le=60)
    webhook_threads: int = Field(default=4, ge=1, le=64)
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)
    webhook_backoff_s: float = Field(default=5.0, gt=0, le=3600)
    webhook_attempts: int = Field(default=8, ge=1, le=30)


#: the largest uid Linux gives out ((uid_t)-1 means "no change")
MAX_UID = 2**32 - 2


def parse_user(text: str) -> tuple[int, int]:
    """``"uid[:gid]"`` (validated digits) as (uid, gid), the gid the uid's number when not given."""
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


class AgentSettings(_Section):
    node_name: str = Field(default_factory=socket.gethostname, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    #: where the other members of a multi-node job reach this node (MASTER_ADDR when it holds rank
    #: 0); empty: the address the node name resolves to
    address: str = Field(default="", max_length=253, pattern=r"^[A-Za-z0-9.:_-]*$")
    #: this node's labels, e.g. {rack = "r12"} (see controller.topology_label)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    node_lease_ttl_s: float = Field(default=10.0, gt=0)
    #: the supervisor kills every attempt this long before an unrenewed lease would expire
    fence_margin_s: float = Field(default=2.0, ge=0.2)
    reconcile_interval_s: float = Field(default=2.0, gt=0)
    #: how often running attempts' new output is shipped to Redis (one round for all of them)
    log_ship_interval_s: float = Field(default=0.2, gt=0, le=10)
    gpus: Literal["auto", "nvml", "simulated"] = "auto"
    simulated_gpus: int = Field(default=4, ge=0)
    simulated_gpu_model: str = "Simulated A100 80GB"
    simulated_gpu_memory: int = 80 * (1 << 30)
    gpu_busy_memory: int = Field(default=1 << 30, description="bytes used above which a GPU counts as busy")
    gpu_release_timeout_s: float = Field(default=10.0, ge=0)
    metrics_port: int = Field(default=9401, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    #: where /metrics listens: it has no authentication, so loopback unless an operator opens it
    metrics_address: str = Field(default="127.0.0.1", max_length=253, pattern=r"^[A-Za-z0-9.:_-]+$")
    runtime: Literal["auto", "docker", "process"] = "auto"
    state_dir: Path = Path("/var/lib/fleet/agent")
    docker_pull: Literal["never", "missing"] = "missing"
    stop_grace_s: float = Field(default=30.0, ge=0)
    worker_threads: int = Field(default=4, ge=1)
    stop_jobs_on_exit: bool = Field(default=False, description="`fleet up` sets it; systemd agents keep jobs")
    #: what the node offers jobs (scheduled, not only limits); default: every core, all memory
    cpus: float | None = Field(default=None, gt=0)
    memory: int | None = Field(default=None, gt=0)
    #: each tenant's jobs run as a uid of its own from this range (gid the same number), given the
    #: first time one of its jobs launches anywhere and kept for good: the same on every node
    job_uid_range: str = Field(default="1000000000-1000999999", pattern=r"^\d{1,10}-\d{1,10}$")
    #: a fixed uid[:gid] every job on this node runs as instead (one person's machine: `fleet up`);
    #: None (or ""): per-tenant uids from job_uid_range
    job_user: str | None = Field(default=None, pattern=r"^\d{1,10}(:\d{1,10})?$", description="uid[:gid]")
    allow_root_jobs: bool = False
    #: keep Docker jobs off this node's own services and off ``job_blocked_networks``: containers on
    #: fleet's network (no reaching the host or each other), multi-node members' uids kept off
    #: loopback (see fleet/agent/netguard.py); needs root and iptables, else the agent says so
    job_network_guard: bool = True
    #: networks jobs may not open connections to (cloud metadata lives at 169.254.169.254)
    job_blocked_networks: list[str] = Field(default_factory=lambda: ["169.254.0.0/16", "fe80::/10"])
    pids_limit: int | None = Field(default=4096, ge=16)
    #: the limits of a job that names none (its spec's ``cpus``, ``memory``, ``shm_size`` win). A
    #: CPU-only job: ``default_cpus``, and ``default_memory`` (None: the node's memory per CPU times
    #: its CPUs). A GPU job: per GPU it holds here, ``default_cpus_per_gpu`` and
    #: ``default_memory_per_gpu`` (None: the node's CPUs or memory divided by its GPUs), as Slurm's
    #: DefCpuPerGPU / DefMemPerGPU
    default_cpus: float = Field(default=1.0, gt=0, le=1024)
    default_memory: Size = Field(default=None, ge=6 << 20)
    default_cpus_per_gpu: float | None = Field(default=None, gt=0, le=1024)
    default_memory_per_gpu: Size = Field(default=None, ge=6 << 20)
    #: /dev/shm of a container (Docker's own 64 MiB breaks PyTorch DataLoader workers)
    default_shm_size: Size = Field(default=1 << 30, ge=1 << 20)
    #: process runtime: each attempt's cgroup is ``<cgroup_parent>/<node>/<job>.<attempt>`` in every
    #: cgroup hierarchy (relative to its root, e.g. /sys/fs/cgroup)
    cgroup_parent: str = Field(
        default="fleet", max_length=200, pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"
    )
    checkpoint_sweep_interval_s: float = Field(default=600.0, gt=0, description="expired jobs' dirs go")
    #: a node that cannot prepare this many attempts in a row (unpack a workdir, make a checkpoint
    #: directory, start a container) cordons itself with the reason; 0: never
    max_prepare_failures: int = Field(default=3, ge=0)
    #: the node supervisor exits once it has held no attempt and heard from no agent this long
    supervisor_idle_exit_s: float = Field(default=300.0, gt=0)

    @field_validator("job_blocked_networks", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """From the environment, JSON: ``FLEET_AGENT__JOB_BLOCKED_NETWORKS='["10.0.0.0/8"]'``."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError('expected a JSON list, e.g. ["169.254.0.0/16", "fe80::/10"]') from None
        return value

    @field_validator("job_blocked_networks")
    @classmethod
    def _blocked(cls, value: list[str]) -> list[str]:
        found = []
        for network in value:
            try:
                found.append(str(ipaddress.ip_network(network, strict=False)))
            except ValueError:
                raise ValueError(f"{network!r} is not a network (e.g. 169.254.0.0/16 or fe80::/10)") from None
        return found

    @field_validator("job_user", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("job_uid_range")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        start, end = (int(n) for n in value.split("-"))
        if start < 1 or end < start or end > MAX_UID:
            raise ValueError(
                f"{value!r}: expected START-END with 1 <= START <= END <= {MAX_UID} (uid 0 is root), "
                "e.g. 1000000000-1000999999: uids no account of the hosts uses"
            )
        return f"{start}-{end}"

    @property
    def uid_range(self) -> tuple[int, int]:
        """(first uid, how many) of ``job_uid_range``."""
        start, end = (int(n) for n in self.job_uid_range.split("-"))
        return start, end - start + 1

    @property
    def fixed_user(self) -> tuple[int, int] | None:
        """``job_user`` as (uid, gid), the gid the uid's number when not given; None: per-tenant uids."""
        return None if self.job_user is None else parse_user(self.job_user)

    @model_validator(mode="after")
    def _root_allowed(self) -> AgentSettings:
        if self.fixed_user is not None and 0 in self.fixed_user and not self.allow_root_jobs:
            raise ValueError(
                f"job_user {self.job_user!r} is root's (uid or gid 0): set allow_root_jobs = true as "
                "well to run every job as root, or give another job_user, or none (per-tenant uids)"
            )
        return self

    @field_validator("cgroup_parent")
    @classmethod
    def _relative(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError(f"{value!r}: a path below the cgroup root, without '.' or '..' (e.g. fleet)")
        return value

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


class ApiSettings(_Section):
    host: str = Field(default="127.0.0.1", max_length=253, description="address `fleet api` listens on")
    port: int = Field(default=8080, ge=0, le=65535)
    #: HTTPS: a PEM certificate (chain) and its key; without them the API speaks plain HTTP
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: calls served at once (waits and log follows hold none while they wait)
    threads: int = Field(default=200, ge=1, le=10_000)
    #: Redis connections the API's calls share; a call finding none free waits for one (up to 10 s)
    redis_connections: int = Field(default=32, ge=2, le=1000)
    #: the largest request body but a blob's (a spec, a tenant, a token request); blobs: workdir_max_bytes
    max_body_bytes: int = Field(default=1 << 20, ge=1 << 10, le=64 << 20)
    #: waits and followed logs one token may hold open at once: one user cannot swell the API's
    #: shared read of the streams they watch without bound
    max_waits_per_token: int = Field(default=16, ge=1, le=10_000)

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("api.tls_cert and api.tls_key: give both (HTTPS) or neither (HTTP)")
        return self


#: the registries a job's image may come from unless the operator says otherwise
REGISTRIES = ("localhost", "docker.io", "nvcr.io", "ghcr.io")


class Settings(BaseModel):
    # defaults validated too (a host name may not be a node name); validators built on first load
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    #: the Redis ACL user (fleet-controller, fleet-agent, fleet-api: config/users.acl); None: default
    redis_username: str | None = Field(default=None, pattern=r"^[!-~]{1,128}$")
    redis_password: SecretStr | None = None
    #: a file whose one line is the password, read when a service connects (systemd's LoadCredential)
    redis_password_file: Path | None = None
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
    #: how long a shipped directory is kept after its last upload or submit
    workdir_retention_s: float = Field(default=7 * DAY, gt=0)
    #: what one tenant's uploads (shipped directories, profiles) may hold in Redis at once
    blob_quota_bytes: int = Field(default=1 << 30, ge=1 << 20)
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

    @model_validator(mode="after")
    def _one_password_source(self) -> Settings:
        if self.redis_password is not None and self.redis_password_file is not None:
            raise ValueError(
                "redis_password (FLEET_REDIS_PASSWORD) and redis_password_file (FLEET_REDIS_PASSWORD_FILE) "
                "are both set: give one"
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

    @property
    def redis_display(self) -> str:
        return redact(self.redis_url)


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
    "controller": ControllerSettings, "agent": AgentSettings, "api": ApiSettings,
}  # fmt: skip
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
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"invalid configuration ({path or 'environment'}): {problems}") from None


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
