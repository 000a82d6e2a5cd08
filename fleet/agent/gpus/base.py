"""The GpuInventory interface, and the rule that says whether a GPU is free for fleet."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import psutil

from fleet.models import Gpu

GiB = 1 << 30


class GpuInventory(Protocol):
    #: "nvml" or "simulated"; the Docker runtime adds device requests only for real GPUs
    backend: str

    def gpus(self) -> list[Gpu]:
        """Every GPU of this node, healthy or not, with memory use and compute processes."""
        ...

    def close(self) -> None: ...


def process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"


def busy_reason(
    gpu: Gpu, fleet_pids: Collection[int], busy_memory: int, name_of: Callable[[int], str] = process_name
) -> str:
    """Why ``gpu`` is not free although healthy: a process fleet did not start, or memory in use."""
    foreign = [pid for pid in gpu.processes if pid not in fleet_pids]
    if foreign:
        return "busy: " + ", ".join(f"foreign pid {pid} ({name_of(pid)})" for pid in foreign)
    if not gpu.processes and gpu.memory_used > busy_memory:
        return f"busy: {gpu.memory_used / GiB:.1f} GiB used with no process fleet knows"
    return ""


def leftovers(gpus: list[Gpu], uuids: Collection[str], fleet_pids: Collection[int]) -> dict[str, list[int]]:
    """Processes still on ``uuids`` that no running fleet attempt owns (a finished job's stragglers)."""
    return {
        g.uuid: stuck
        for g in gpus
        if g.uuid in uuids and (stuck := [pid for pid in g.processes if pid not in fleet_pids])
    }
