"""Runtimes that run job attempts: Docker containers, or plain processes for bare metal and development."""

from __future__ import annotations

import logging

from fleet.agent.runtime.base import AttemptStatus, LaunchSpec, Runtime
from fleet.config import AgentSettings
from fleet.errors import RuntimeUnavailable
from fleet.log import event

log = logging.getLogger("fleet.agent.runtime")

__all__ = ["AttemptStatus", "LaunchSpec", "Runtime", "open_runtime"]


def open_runtime(settings: AgentSettings) -> Runtime:
    """Docker when asked for or when a daemon answers (``auto``); else the process runtime."""
    if settings.runtime != "process":
        from fleet.agent.runtime.docker import DockerRuntime

        try:
            return DockerRuntime(settings.node_name, pull=settings.docker_pull)
        except RuntimeUnavailable as exc:
            if settings.runtime == "docker":
                raise
            event(log, "docker_unavailable", error=exc, fallback="process runtime")
    from fleet.agent.runtime.process import ProcessRuntime

    return ProcessRuntime(settings.node_name, settings.state_dir / "attempts")
