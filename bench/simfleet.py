"""What a simulated fleet is made of (``bench/nodesim.py``): node groups, simulated nodes with their
GPUs, attempts, and how long a simulated job runs."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field

from fleet.bus import node_queue
from fleet.models import Gpu, JobSpec
from fleet.state.nodes import NodeInfo

SECONDS_LABEL, EXIT_LABEL = "FLEET_SIM_SECONDS", "FLEET_SIM_EXIT"
GiB = 1 << 30


@dataclass(frozen=True)
class Group:
    """``count`` nodes named ``<prefix>-NNNN`` with ``gpus`` GPUs of ``model`` each."""

    count: int
    gpus: int = 8
    model: str = "Sim A100 80GB"
    prefix: str = "sim"
    memory: int = 80 * GiB

    @classmethod
    def parse(cls, text: str) -> Group:
        """``COUNT[:GPUS[:MODEL[:PREFIX]]]``, e.g. ``500:8:Sim H100 80GB:h100``."""
        count, gpus, model, prefix = [*text.split(":", 3), "", "", ""][:4]
        return cls(int(count), int(gpus or 8), model or cls.model, prefix or cls.prefix)


def run_for(spec: JobSpec, default_s: float) -> tuple[float, int]:
    """(seconds the simulated attempt runs, its exit code)."""
    code = int(spec.labels.get(EXIT_LABEL, "1" if spec.command[0].endswith("false") else "0"))
    if SECONDS_LABEL in spec.labels:
        return float(spec.labels[SECONDS_LABEL]), code
    program = spec.command[0].rsplit("/", 1)[-1]
    if program == "sleep" and len(spec.command) == 2:
        with contextlib.suppress(ValueError):
            return float(spec.command[1]), code
    if program in ("true", "false"):
        return 0.0, code
    return default_s, code


@dataclass
class SimNode:
    name: str
    queue: str
    gpus: list[Gpu]
    #: the heartbeat's inventory fields, serialised once (a simulated inventory never changes)
    fields: str
    #: GPU uuid -> (job id, attempt) of the simulated attempt holding it
    held: dict[str, tuple[str, int]] = field(default_factory=dict)


@dataclass
class Attempt:
    job_id: str
    attempt: int
    node: SimNode
    gpus: list[str]
    code: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.job_id, self.attempt


@dataclass
class Stats:
    launched: int = 0
    ignored: int = 0
    finished: int = 0
    joined: int = 0
    #: job id -> times this simulator ended one of its attempts SUCCEEDED
    succeeded: Counter[str] = field(default_factory=Counter)
    #: "job:attempt wants GPU g held by job:attempt" for every double claim seen at launch
    conflicts: list[str] = field(default_factory=list)
    heartbeat_rounds: int = 0
    heartbeat_last_s: float = 0.0
    heartbeat_max_s: float = 0.0
    errors: int = 0


def make_nodes(groups: list[Group]) -> list[SimNode]:
    nodes = []
    for group in groups:
        for i in range(group.count):
            name = f"{group.prefix}-{i:04d}"
            gpus = [Gpu(uuid=f"GPU-{name}-{g}", index=g, model=group.model, memory_total=group.memory)
                    for g in range(group.gpus)]  # fmt: skip
            info = NodeInfo(gpus=gpus, cpus=64, memory=512 * GiB, runtime="sim", gpu_backend="simulated")
            nodes.append(SimNode(name, node_queue(name), gpus, json.dumps(info.fields())))
    return nodes
