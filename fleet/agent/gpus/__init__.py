"""GPU inventory backends behind one small interface."""

from __future__ import annotations

import logging

from fleet.agent.gpus.base import GpuInventory, busy_reason, leftovers
from fleet.agent.gpus.simulated import SimulatedGpus
from fleet.config_sections import AgentSettings
from fleet.errors import GpuError
from fleet.log import event

log = logging.getLogger("fleet.agent.gpus")

__all__ = ["GpuInventory", "SimulatedGpus", "busy_reason", "leftovers", "open_inventory"]


def open_inventory(settings: AgentSettings) -> GpuInventory:
    """NVML when asked for or found (``auto``); else ``simulated_gpus`` simulated GPUs."""
    if settings.gpus != "simulated":
        from fleet.agent.gpus.nvml import NvmlGpus

        try:
            nvml = NvmlGpus()
            if nvml.gpus() or settings.gpus == "nvml":
                return nvml
            nvml.close()
        except GpuError as exc:
            if settings.gpus == "nvml":
                raise
            event(log, "nvml_unavailable", error=exc, fallback=f"{settings.simulated_gpus} simulated GPUs")
    return SimulatedGpus(
        settings.node_name,
        settings.simulated_gpus,
        settings.simulated_gpu_model,
        settings.simulated_gpu_memory,
    )
