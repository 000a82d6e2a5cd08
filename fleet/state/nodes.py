"""Nodes in Redis: leases, heartbeats, inventory and the operator's admin state."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from fleet.errors import FleetError, NotFound, NotLeader
from fleet.keys import Keys
from fleet.models import Gpu, Node, NodeState
from fleet.state.connection import load_scripts, translated


class LeaseConflict(FleetError):
    """Another agent holds this node's lease: two agents were started with one node name."""


@dataclass(frozen=True)
class NodeInfo:
    """What an agent publishes with each heartbeat."""

    gpus: list[Gpu]
    cpus: int
    memory: int
    runtime: str
    gpu_backend: str

    def fields(self) -> dict[str, str]:
        return {
            "gpus": json.dumps([g.model_dump() for g in self.gpus]),
            "cpus": str(self.cpus),
            "memory": str(self.memory),
            "runtime": self.runtime,
            "gpu_backend": self.gpu_backend,
        }


class NodeStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)

    @translated
    def heartbeat(self, name: str, agent_id: str, ttl_s: float, now: float, info: NodeInfo) -> bool:
        """Renew the node lease and publish ``info``; True when the node (re)joined."""
        k = self.keys
        code, holder = self._scripts["heartbeat"](
            keys=[k.node_lease(name), k.node(name), k.nodes],
            args=[agent_id, int(ttl_s * 1000), now, name, json.dumps(info.fields())],
        )
        if code == -1:
            raise LeaseConflict(f"node {name!r} is held by agent {holder}; give each agent its own node_name")
        return bool(code == 1)

    @translated
    def set_state(
        self, name: str, state: NodeState, reason: str, now: float, by: str = "", *, leader: str = "",
        only_from: Iterable[NodeState] = (), **extra: float | str,
    ) -> bool:  # fmt: skip
        """Set the admin state; ``extra`` fields (drain deadline, grace) are set too, or cleared.

        False when the state is not one of ``only_from`` (when given). A controller passes its
        ``leader`` value and is refused with :class:`NotLeader` unless it still holds the lease.
        """
        fields = {"state": state.value, "reason": reason, "changed_at": now, "changed_by": by,
                  "drain_deadline": "", "drain_grace_s": "", **extra}  # fmt: skip
        k = self.keys
        allowed = ",".join(s.value for s in only_from)
        changes = json.dumps({f: str(v) for f, v in fields.items()})
        code = self._scripts["node_state"](
            keys=[k.node(name), k.nodes, k.leader], args=[name, leader, allowed, changes]
        )
        if code == -1:
            raise NotFound(f"no node {name!r} (list nodes with `fleet nodes`)")
        if code == -2:
            raise NotLeader(f"state of node {name} not set: another controller holds the leader lease")
        return bool(code == 1)

    @translated
    def names(self) -> list[str]:
        return sorted(self.redis.smembers(self.keys.nodes))

    @translated
    def all(self) -> list[Node]:
        names = self.names()
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.node(name))
            pipe.exists(self.keys.node_lease(name))
            pipe.smembers(self.keys.node_jobs(name))
        pipe.hgetall(self.keys.claims)
        results = pipe.execute()
        claims: dict[str, str] = results[-1]
        return [
            _node(name, raw, bool(alive), claims, sorted(jobs))
            for name, raw, alive, jobs in zip(
                names, results[0:-1:3], results[1:-1:3], results[2:-1:3], strict=True
            )
            if raw
        ]

    def get(self, name: str) -> Node:
        for node in self.all():
            if node.name == name:
                return node
        raise NotFound(f"no node {name!r} (list nodes with `fleet nodes`)")


def _node(name: str, raw: dict[str, str], alive: bool, claims: dict[str, str], jobs: list[str]) -> Node:
    gpus = [Gpu.model_validate(g) for g in json.loads(raw.get("gpus") or "[]")]
    admin = NodeState(raw.get("state", NodeState.READY))
    return Node(
        name=name,
        state=admin if alive else NodeState.DOWN,
        admin_state=admin,
        alive=alive,
        reason=raw.get("reason", "") if alive else "lease expired (no heartbeat)",
        heartbeat_at=float(raw.get("heartbeat_at", 0)),
        gpus=gpus,
        cpus=int(raw.get("cpus", 0)),
        memory=int(raw.get("memory", 0)),
        runtime=raw.get("runtime", ""),
        gpu_backend=raw.get("gpu_backend", ""),
        claims={g.uuid: claims[g.uuid] for g in gpus if g.uuid in claims},
        changed_at=float(raw.get("changed_at") or 0),
        changed_by=raw.get("changed_by", ""),
        drain_deadline=float(raw["drain_deadline"]) if raw.get("drain_deadline") else None,
        drain_grace_s=float(raw.get("drain_grace_s") or 0),
        jobs=jobs,
    )
