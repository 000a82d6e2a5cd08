"""Every check of ``fleet doctor``, in order, with the settings the agent would run with."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from fleet.config import Settings
from fleet.keys import Keys
from fleet.ops.doctor.connection import clock_check, redis_check, redis_clock
from fleet.ops.doctor.gpus import gpu_checks
from fleet.ops.doctor.host import address_check, cgroup_check, network_guard_check, port_check
from fleet.ops.doctor.report import FAIL, OK, SKIP, Check
from fleet.ops.doctor.runtime import runtime_checks
from fleet.ops.doctor.storage import checkpoint_check, job_identity, new_marker, shared_check


def with_installed_credentials(settings: Settings, root: Path = Path("/")) -> tuple[Settings, str]:
    """``settings`` with the Redis user and password file ``fleet install agent`` gave the agent's
    unit, when neither the file nor the environment gives any (and the sentinels' password file, with
    sentinels and none given); and a note saying so, or ''."""
    from fleet.ops.install import installed_credentials, installed_sentinel_password

    note, update = " (the installed agent unit's)", {}
    given = (settings.redis_username, settings.redis_password, settings.redis_password_file)
    if all(v is None for v in given):
        username, password_file = installed_credentials("agent", root)
        update = {
            k: v for k, v in (("redis_username", username), ("redis_password_file", password_file)) if v
        }
    sentinel = (settings.redis_sentinel_password, settings.redis_sentinel_password_file)
    if settings.redis_sentinels and all(v is None for v in sentinel):
        found = installed_sentinel_password("agent", root)
        update.update({"redis_sentinel_password_file": found} if found else {})
    return (settings.model_copy(update=update), note) if update else (settings, "")


def diagnose(settings: Settings, config: str | None = None) -> Iterator[Check]:
    """Every check, in order, each as soon as it is done."""
    cfg = settings.agent
    source = config or os.environ.get("FLEET_CONFIG") or "no config file, defaults and FLEET_*"
    yield Check("config", OK, f"{source}: node {cfg.node_name}, runtime {cfg.runtime}, gpus {cfg.gpus}")
    gpu_lines, gpus = gpu_checks(cfg)
    yield from gpu_lines
    runtime_lines, runtime = runtime_checks(cfg, gpus, settings.default_image)
    yield from runtime_lines
    yield cgroup_check(runtime)
    yield network_guard_check(cfg, runtime)
    settings, note = with_installed_credentials(settings)
    redis_line, client = redis_check(settings, note)
    yield redis_line
    keys = Keys(settings.key_prefix)
    if client is not None:
        try:
            before = time.time()
            redis_now = redis_clock(client, keys.doctor(f"clock:{cfg.node_name}"))
            yield clock_check(before, redis_now, time.time(), cfg.fence_margin_s)
        except redis.RedisError as exc:
            yield Check("clock", FAIL, f"cannot read Redis' clock: {exc}", "see the redis line")
    else:
        yield Check("clock", SKIP, "Redis did not answer")
    root = settings.checkpoint_root
    marker = new_marker(cfg.node_name, root, time.time())
    stored = checkpoint_check(root, cfg.node_name, marker, *job_identity(cfg))
    yield stored
    if client is None or stored.status == FAIL:
        yield Check("shared storage", SKIP, "needs Redis and a writable checkpoint_root")
    else:
        yield shared_check(client, keys, root, cfg.node_name, marker, time.time())
    ports = settings.controller
    yield port_check(ports.rendezvous_port_base, ports.rendezvous_ports)
    yield address_check(cfg)
    if client is not None:
        client.close()
