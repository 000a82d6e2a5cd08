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
#: one simulated attempt on one node: (job id, attempt, node); a multi-node job's attempt has one per
#: member, each on its own node
Key = tuple[str, int, str]


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
    #: GPU uuid -> the simulated attempt holding it
    held: dict[str, Key] = field(default_factory=dict)

    def unknown(self, gpus: list[str]) -> str:
        """Why ``gpus`` cannot be taken here: one is not on this node; or ""."""
        known = {g.uuid for g in self.gpus}
        return next((f"GPU {u} is not on node {self.name}" for u in gpus if u not in known), "")

    def hold(self, key: Key, gpus: list[str]) -> str:
        """Take ``gpus`` for ``key``, all or none; the double claim if another attempt holds one, or ""."""
        for uuid in gpus:
            if uuid in self.held:
                holder = self.held[uuid]
                return f"{key[0]}:{key[1]} on {key[2]} wants {uuid} held by {holder[0]}:{holder[1]}"
        self.held.update(dict.fromkeys(gpus, key))
        return ""

    def free(self, key: Key, gpus: list[str]) -> None:
        for uuid in gpus:
            if self.held.get(uuid) == key:
                del self.held[uuid]


@dataclass
class Attempt:
    job_id: str
    attempt: int
    node: SimNode
    gpus: list[str]
    code: int = 0
    #: the member's rank in a multi-node job (0 for a single-node job)
    rank: int = 0

    @property
    def key(self) -> Key:
        return self.job_id, self.attempt, self.node.name


@dataclass
class Stats:
    #: attempts started (a multi-node job's: one per member)
    launched: int = 0
    #: members of multi-node jobs that ended with 0 while others still ran
    members_done: int = 0
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
            gpus = [
                Gpu(uuid=f"GPU-{name}-{g}", index=g, model=group.model, memory_total=group.memory)
                for g in range(group.gpus)
            ]
            info = NodeInfo(gpus=gpus, cpus=64, memory=512 * GiB, runtime="sim", gpu_backend="simulated")
            nodes.append(SimNode(name, node_queue(name), gpus, json.dumps(info.fields())))
    return nodes
