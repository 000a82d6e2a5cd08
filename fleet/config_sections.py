"""The per-service sections of fleet's settings: ``[controller]``, ``[agent]`` and ``[api]`` of
``fleet.toml`` (``FLEET_CONTROLLER__*``, ``FLEET_AGENT__*``, ``FLEET_API__*``). :mod:`fleet.config`
holds the settings every service reads, these sections among them, and where they come from.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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
        default=1800.0,
        gt=0,
        description="STARTING longer: launch hung (a multi-node job is STARTING until every member runs)",
    )
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
    #: no elastic job is resized again sooner than this after it started or was resized (a minute,
    #: as Pollux's rounds: the restart penalty already keeps a young job at its size unless a resize
    #: pays well; in Pollux's simulator 60 s beat 120 s at 1x and 2x, BENCHMARKS.md)
    elastic_min_interval_s: float = Field(default=60.0, ge=0)
    #: what one resize costs a job (SIGTERM, checkpoint, requeue, restart, restore): a resize is made
    #: only when the throughput it gains outweighs it
    resize_cost_s: float = Field(default=30.0, ge=0)
    #: elastic jobs that have run less come first when GPUs are shared out: a job's value halves
    #: once it has had this many GPU-seconds (a third at twice that, never below a tenth:
    #: ``elastic.SERVICE_FLOOR``; 0: off). The default, about 5.6
    #: GPU-hours, cut the average JCT by 15 % in Pollux's simulator (BENCHMARKS)
    elastic_service_s: float = Field(default=20_000.0, ge=0)
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
    #: ``fleet shell`` sessions this node runs at once (0: none), and how long one may pass no byte
    #: either way before it is ended
    shell_max_sessions: int = Field(default=8, ge=0, le=1000)
    shell_idle_s: float = Field(default=3600.0, gt=0)
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

    @field_validator("state_dir")
    @classmethod
    def _socket_fits(cls, value: Path) -> Path:
        # the node supervisor listens on STATE_DIR/supervisor.sock; Linux holds 107 bytes of a path
        used = len(os.fsencode(value / "supervisor.sock"))
        if used > 107:
            raise ValueError(
                f"{str(value)!r} is too long for the node supervisor's socket in it ({used} bytes with "
                "'/supervisor.sock'; a Unix socket's path holds at most 107): pick a shorter directory"
            )
        return value

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
