"""Real GPUs through NVML (``nvidia-ml-py``). Errors become :class:`GpuError` or an unhealthy GPU."""

from __future__ import annotations

import contextlib

import pynvml

from fleet.errors import GpuError
from fleet.models import Gpu


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlGpus:
    backend = "nvml"

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise GpuError(
                "NVML library not found (libnvidia-ml.so: is the NVIDIA driver installed?); "
                "set agent.gpus = 'simulated' to run without GPUs"
            ) from exc
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML failed to initialise: {exc}") from exc

    def gpus(self) -> list[Gpu]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML could not count GPUs: {exc}") from exc
        return [self._gpu(i) for i in range(count)]

    def _gpu(self, index: int) -> Gpu:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            return Gpu(uuid=f"unknown-{index}", index=index, model="?", memory_total=0, healthy=False,
                       health=f"lost: {exc}")  # fmt: skip
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            return Gpu(
                uuid=uuid,
                index=index,
                model=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_total=int(memory.total),
                memory_used=int(memory.used),
                utilization=int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                temperature=int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                processes=sorted(int(p.pid) for p in processes),
            )
        except pynvml.NVMLError as exc:
            return Gpu(
                uuid=uuid, index=index, model="?", memory_total=0, healthy=False, health=f"error: {exc}"
            )

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
