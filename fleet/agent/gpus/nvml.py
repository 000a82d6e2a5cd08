"""Real GPUs through NVML (``nvidia-ml-py``). Errors become :class:`GpuError` or an unhealthy GPU."""

from __future__ import annotations

import contextlib

import pynvml

from fleet.errors import GpuError
from fleet.models import Gpu

LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
#: what an operator does about an NVML error, by its code (``fleet doctor`` prints it)
FIXES = {
    LIBRARY_NOT_FOUND: "install the NVIDIA driver (it ships libnvidia-ml.so), or set "
    "agent.gpus = 'simulated' on a node without GPUs",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "load the NVIDIA kernel module (modprobe nvidia; see dmesg), or "
    "reboot after installing the driver",
    pynvml.NVML_ERROR_NO_PERMISSION: "run as root, as the agent does (or give this user the /dev/nvidia* "
    "devices)",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reboot: reboot the node",
    pynvml.NVML_ERROR_GPU_IS_LOST: "the GPU fell off the bus: look for Xid errors in dmesg, drain the node "
    "(fleet drain NODE), reset the GPU (nvidia-smi -r) or reboot",
    pynvml.NVML_ERROR_RESET_REQUIRED: "reset the GPU (nvidia-smi -r) or reboot the node",
    pynvml.NVML_ERROR_INSUFFICIENT_POWER: "the GPU lacks power: check its power cables and supply",
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: "the GPU's infoROM is corrupted: have it serviced or replaced",
}


def fix(code: int | None) -> str:
    """What to do about NVML error ``code``."""
    return FIXES.get(code or 0, "see nvidia-smi and dmesg; nvidia-smi -q shows each GPU's state")


def _cuda(version: int) -> str:
    """CUDA's version as NVML gives it, a number: 12040 is 12.4."""
    return f"{version // 1000}.{version % 1000 // 10}"


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
                "set agent.gpus = 'simulated' to run without GPUs",
                exc.value,
            ) from exc
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML failed to initialise: {exc}", exc.value) from exc

    def versions(self) -> dict[str, str]:
        """The driver's, NVML's and the CUDA driver API's versions, those NVML gives."""
        found = {}
        queries = {
            "driver": pynvml.nvmlSystemGetDriverVersion,
            "nvml": pynvml.nvmlSystemGetNVMLVersion,
            "cuda": pynvml.nvmlSystemGetCudaDriverVersion,
        }
        for name, query in queries.items():
            with contextlib.suppress(pynvml.NVMLError):
                value = query()
                found[name] = _cuda(value) if isinstance(value, int) else _text(value)
        return found

    def count(self) -> int:
        try:
            return int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML could not count GPUs: {exc}", exc.value) from exc

    def gpus(self) -> list[Gpu]:
        return [self.probe(i)[0] for i in range(self.count())]

    def probe(self, index: int) -> tuple[Gpu, int | None]:
        """GPU ``index`` as :meth:`gpus` reports it, and the NVML error code when it did not answer
        (then it is unhealthy, its ``health`` saying why); None when it did."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            return Gpu(
                uuid=f"unknown-{index}",
                index=index,
                model="?",
                memory_total=0,
                healthy=False,
                health=f"lost: {exc}",
            ), exc.value
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            gpu = Gpu(
                uuid=uuid,
                index=index,
                model=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_total=int(memory.total),
                memory_used=int(memory.used),
                utilization=int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                temperature=int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                processes=sorted(int(p.pid) for p in processes),
            )
            return gpu, None
        except pynvml.NVMLError as exc:
            return Gpu(
                uuid=uuid, index=index, model="?", memory_total=0, healthy=False, health=f"error: {exc}"
            ), exc.value

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
