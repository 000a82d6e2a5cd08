"""Runtimes that run job attempts: Docker containers, or plain processes for bare metal and development."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from fleet.agent.cgroups import Cgroups, log_layout
from fleet.agent.runtime.base import AttemptStatus, LaunchSpec, Runtime
from fleet.agent.supervision import SupervisorClient
from fleet.config_sections import AgentSettings
from fleet.errors import ConfigError, RuntimeUnavailable
from fleet.log import event

log = logging.getLogger("fleet.agent.runtime")

__all__ = ["AttemptStatus", "LaunchSpec", "Runtime", "open_runtime"]
RECORD = "runtime"


def open_runtime(settings: AgentSettings, supervisor: SupervisorClient, cgroups: Cgroups) -> Runtime:
    """The configured runtime; ``auto`` is the one recorded in the state dir, else Docker when it is
    installed, else processes (each attempt in a cgroup of its own, in ``cgroups``). Docker installed
    but not answering is an error, never a fallback."""
    name = choose(settings.runtime, recorded_runtime(settings.state_dir), docker_installed())
    if name == "docker":
        from fleet.agent.runtime.docker import DockerRuntime

        try:
            guard = settings if settings.job_network_guard else None
            runtime: Runtime = DockerRuntime(
                settings.node_name,
                settings.state_dir / "attempts",
                supervisor,
                pull=settings.docker_pull,
                guard=guard,
            )
        except RuntimeUnavailable as exc:
            raise RuntimeUnavailable(
                f"{exc}; this node runs the docker runtime (runtime={settings.runtime!r}): start dockerd, "
                'or set runtime = "process" once no container of this node is left'
            ) from exc
    else:
        from fleet.agent.runtime.process import ProcessRuntime

        runtime = ProcessRuntime(settings.node_name, settings.state_dir / "attempts", supervisor, cgroups)
        log_layout(cgroups)
    _record(settings.state_dir, name)
    event(log, "runtime_chosen", runtime=name, configured=settings.runtime)
    return runtime


def choose(configured: str, recorded: str | None, docker: bool) -> str:
    """Pure: which runtime to open. A configured one must match the recorded one (its attempts may
    still run); ``auto`` keeps the recorded one, else takes Docker wherever Docker is installed."""
    if configured != "auto":
        if recorded and recorded != configured:
            raise ConfigError(
                f"agent.runtime: this node's attempts ran under the {recorded} runtime (recorded in "
                f"state_dir/{RECORD}); stop them and delete that file before switching to {configured}"
            )
        return configured
    if recorded:
        return recorded
    return "docker" if docker else "process"


def docker_installed() -> bool:
    return shutil.which("dockerd") is not None or Path("/var/run/docker.sock").exists()


def recorded_runtime(state_dir: Path) -> str | None:
    """The runtime this node's attempts ran under (state_dir/runtime), if any."""
    try:
        name = (state_dir / RECORD).read_text().strip()
    except FileNotFoundError:
        return None
    return name if name in ("docker", "process") else None


def _record(state_dir: Path, name: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / RECORD).write_text(f"{name}\n")
