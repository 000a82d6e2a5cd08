"""The agent's two GPU checks: before a launch (is every assigned GPU here, healthy and free?) and
after an exit (have the job's processes left its GPUs?). NVML is the judge, not the claims."""

from __future__ import annotations

import time

from fleet.agent.gpus import GpuInventory, busy_reason, leftovers
from fleet.agent.runtime import Runtime
from fleet.errors import GpuBusy


def check_assigned(
    inventory: GpuInventory, runtime: Runtime, uuids: list[str], node: str, busy_memory: int
) -> None:
    """Raise :class:`GpuBusy` (the launch is refused, the job requeued) unless every GPU is usable."""
    if not uuids:
        return
    gpus = {g.uuid: g for g in inventory.gpus()}
    fleet_pids = runtime.pids() if any(gpus[u].processes for u in uuids if u in gpus) else set()
    for uuid in uuids:
        gpu = gpus.get(uuid)
        if gpu is None:
            raise GpuBusy(f"GPU {uuid} is not on node {node}")
        if not gpu.healthy:
            raise GpuBusy(f"GPU {gpu.index} ({uuid}) is unhealthy: {gpu.health}")
        if why := busy_reason(gpu, fleet_pids, busy_memory):
            raise GpuBusy(f"GPU {gpu.index} ({uuid}) is {why}")


def await_released(
    inventory: GpuInventory, runtime: Runtime, uuids: list[str], timeout_s: float
) -> dict[str, list[int]]:
    """Wait up to ``timeout_s`` for processes no running attempt owns to leave ``uuids``; return
    those still there (empty when the GPUs are free)."""
    deadline = time.monotonic() + timeout_s
    while uuids:
        gpus = inventory.gpus()
        pids = runtime.pids() if any(g.processes for g in gpus if g.uuid in uuids) else set()
        stuck = leftovers(gpus, uuids, pids)
        if not stuck or time.monotonic() >= deadline:
            return stuck
        time.sleep(0.2)
    return {}
