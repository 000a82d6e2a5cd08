"""Simulated GPUs for machines without any: stable UUIDs, fixed model and memory."""

from __future__ import annotations

import uuid

from fleet.models import Gpu


class SimulatedGpus:
    backend = "simulated"

    def __init__(self, node: str, count: int, model: str, memory: int) -> None:
        self._gpus = [
            Gpu(
                uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{i}.fleet')}",
                index=i,
                model=model,
                memory_total=memory,
            )
            for i in range(count)
        ]

    def gpus(self) -> list[Gpu]:
        return list(self._gpus)

    def set_gpu(self, index: int, **changes: object) -> None:
        """Change a simulated GPU (tests: mark it lost, give it a foreign process)."""
        self._gpus[index] = self._gpus[index].model_copy(update=changes)

    def close(self) -> None:
        return None
