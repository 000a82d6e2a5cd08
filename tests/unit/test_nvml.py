"""The NVML inventory against a patched pynvml, and the rule for a free GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from fleet.agent.gpus import SimulatedGpus, busy_reason, leftovers, open_inventory
from fleet.agent.gpus.nvml import NvmlGpus
from fleet.config_sections import AgentSettings
from fleet.errors import GpuError
from fleet.models import Gpu

GiB = 1 << 30


class FakeNvml:
    """Two GPUs; the second runs pid 4242."""

    def __init__(self, lost: int | None = None) -> None:
        self.lost = lost

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetTemperature",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i == self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * GiB, used=(0 if h == 0 else 30 * GiB), free=0)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=0 if h == 0 else 97, memory=0)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 41 + h

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [] if h == 0 else [SimpleNamespace(pid=4242, usedGpuMemory=30 * GiB)]


def test_enumerates_gpus_by_uuid_with_memory_and_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml().install(monkeypatch)
    gpus = NvmlGpus().gpus()
    assert [g.uuid for g in gpus] == [
        "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
    ]
    assert gpus[0].model == "NVIDIA H100 80GB HBM3" and gpus[0].memory_total == 80 * GiB
    assert (gpus[1].memory_used, gpus[1].utilization, gpus[1].processes) == (30 * GiB, 97, [4242])
    assert (gpus[0].temperature, gpus[1].temperature) == (41, 42)


def test_a_foreign_compute_process_makes_a_gpu_not_free(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml().install(monkeypatch)
    free, taken = NvmlGpus().gpus()
    names = {4242: "python"}.__getitem__
    assert busy_reason(free, set(), GiB, names) == ""
    assert busy_reason(taken, set(), GiB, names) == "busy: foreign pid 4242 (python)"
    assert busy_reason(taken, {4242}, GiB, names) == ""  # fleet's own job


def test_memory_used_without_a_known_process_makes_a_gpu_busy() -> None:
    gpu = Gpu(uuid="GPU-x", index=0, model="m", memory_total=80 * GiB, memory_used=3 * GiB)
    assert busy_reason(gpu, set(), GiB) == "busy: 3.0 GiB used with no process fleet knows"


def test_a_lost_gpu_is_reported_unhealthy_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(lost=1).install(monkeypatch)
    gpus = NvmlGpus().gpus()
    assert gpus[0].healthy and not gpus[1].healthy
    assert gpus[1].health.startswith("lost: ")


def _no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)


def test_missing_nvml_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_library(monkeypatch)
    with pytest.raises(GpuError, match=r"NVML library not found .* set agent.gpus = 'simulated'"):
        open_inventory(AgentSettings(gpus="nvml"))


def test_auto_falls_back_to_simulated_gpus_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_library(monkeypatch)
    inventory = open_inventory(AgentSettings(gpus="auto", simulated_gpus=3, node_name="n1"))
    assert isinstance(inventory, SimulatedGpus) and len(inventory.gpus()) == 3


def test_auto_uses_nvml_when_it_finds_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml().install(monkeypatch)
    assert open_inventory(AgentSettings(gpus="auto")).backend == "nvml"


def test_simulated_gpu_uuids_are_stable_and_unique_per_node() -> None:
    a, b = SimulatedGpus("a", 2, "m", GiB), SimulatedGpus("b", 2, "m", GiB)
    assert [g.uuid for g in a.gpus()] == [g.uuid for g in SimulatedGpus("a", 2, "m", GiB).gpus()]
    assert not {g.uuid for g in a.gpus()} & {g.uuid for g in b.gpus()}


def test_a_finished_jobs_leftover_process_is_found_on_its_gpus_only(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml().install(monkeypatch)
    gpus = NvmlGpus().gpus()
    mine, other = gpus[1].uuid, gpus[0].uuid
    # pid 4242 still holds the finished job's GPU, and no running fleet attempt owns it
    assert leftovers(gpus, [mine], fleet_pids=set()) == {mine: [4242]}
    # the same process owned by another running fleet attempt, or a GPU the job did not hold: nothing
    assert leftovers(gpus, [mine], fleet_pids={4242}) == {}
    assert leftovers(gpus, [other], fleet_pids=set()) == {}
