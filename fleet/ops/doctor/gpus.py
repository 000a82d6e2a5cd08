"""The GPU checks: NVML, the driver's versions, and a line per GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fleet.agent.gpus import busy_reason
from fleet.config_sections import AgentSettings
from fleet.errors import GpuError
from fleet.ops.doctor.report import FAIL, OK, SKIP, WARN, Check

if TYPE_CHECKING:  # NVML is imported by the checks that use it
    from fleet.agent.gpus.nvml import NvmlGpus

_BUSY_FIX = (
    "fleet places no job on a busy GPU: end that process "
    "(an agent running here shows its own jobs' processes too)"
)


def gpu_checks(cfg: AgentSettings) -> tuple[list[Check], int]:
    """NVML, the driver, and a line per GPU; with the number of real GPUs that answered."""
    from fleet.agent.gpus import nvml

    simulated = f"{cfg.simulated_gpus} simulated GPUs"
    if cfg.gpus == "simulated":
        return [Check("nvml", SKIP, f"not used: agent.gpus = simulated, the agent offers {simulated}")], 0
    try:
        gpus = nvml.NvmlGpus()
    except GpuError as exc:
        if cfg.gpus == "auto" and exc.code == nvml.LIBRARY_NOT_FOUND:
            found = f"no NVML library (libnvidia-ml.so): the agent will offer {simulated}"
            return [Check("nvml", WARN, found, nvml.fix(exc.code))], 0
        then = f"the agent would offer {simulated} instead" if cfg.gpus == "auto" else "the agent won't start"
        return [Check("nvml", FAIL, f"{exc}: {then}", nvml.fix(exc.code))], 0
    try:
        return _each_gpu(cfg, gpus, simulated, nvml.fix)
    finally:
        gpus.close()


def _each_gpu(
    cfg: AgentSettings, gpus: NvmlGpus, simulated: str, fix: Callable[[int | None], str]
) -> tuple[list[Check], int]:
    about = ", ".join(f"{name} {version}" for name, version in gpus.versions().items()) or "versions unknown"
    try:
        count = gpus.count()
    except GpuError as exc:
        return [Check("nvml", FAIL, f"{about}: {exc}", fix(exc.code))], 0
    if not count:
        then = f"the agent will offer {simulated}" if cfg.gpus == "auto" else "this node offers no GPU"
        no_gpu = "see nvidia-smi; on a node without GPUs set agent.gpus = 'simulated'"
        return [Check("nvml", WARN, f"{about}; NVML finds no GPU: {then}", no_gpu)], 0
    checks, answered = [Check("nvml", OK, f"{about}; {count} GPU{'s' * (count > 1)}")], 0
    for index in range(count):
        gpu, code = gpus.probe(index)
        name = f"gpu {index}"
        if code is not None or not gpu.healthy:
            checks.append(Check(name, FAIL, f"{gpu.uuid}: {gpu.health}", fix(code)))
            continue
        answered += 1
        found = f"{gpu.model}, {gpu.memory_total / (1 << 30):.0f} GiB, {gpu.uuid}"
        if why := busy_reason(gpu, (), cfg.gpu_busy_memory):
            checks.append(Check(name, WARN, f"{found}: {why}", _BUSY_FIX))
        else:
            checks.append(Check(name, OK, found))
    return checks, answered
