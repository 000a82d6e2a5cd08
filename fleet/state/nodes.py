"""Nodes in Redis: leases, heartbeats, inventory and the operator's admin state."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from fleet.errors import CorruptRecord, FleetError, NotFound, NotLeader
from fleet.keys import Keys
from fleet.models import Gpu, Node, NodeState
from fleet.state.connection import load_scripts, translated
from fleet.state.records import NodeBatch, node_version, parse_node
from fleet.state.replication import replicated
from fleet.versions import VERSION


class LeaseConflict(FleetError):
    """Another agent holds this node's lease: two agents were started with one node name."""


@dataclass(frozen=True)
class NodeInfo:
    """What an agent publishes with each heartbeat."""

    gpus: list[Gpu]
    #: allocatable: what jobs may be granted on this node
    cpus: float
    memory: int
    runtime: str
    gpu_backend: str
    #: where other nodes reach this one (a multi-node job's MASTER_ADDR)
    address: str = ""
    #: the operator's labels for this node (rack, ...)
    labels: dict[str, str] = field(default_factory=dict)
    #: the agent's release (see fleet.versions)
    version: str = VERSION

    def fields(self) -> dict[str, str]:
        return {
            "gpus": json.dumps([g.model_dump() for g in self.gpus]),
            "cpus": f"{self.cpus:g}",
            "memory": str(self.memory),
            "runtime": self.runtime,
            "gpu_backend": self.gpu_backend,
            "address": self.address,
            "labels": json.dumps(self.labels, sort_keys=True),
            "sched": self.digest(),
            "version": self.version,
        }

    def digest(self) -> str:
        """What placement depends on (not utilisation or temperature, which change every beat):
        the heartbeat script marks the node changed for the scheduler only when this changes."""
        gpus = [(g.uuid, g.index, g.model, g.memory_total, g.healthy, g.health, g.busy) for g in self.gpus]
        text = json.dumps(
            [gpus, self.cpus, self.memory, self.runtime, self.address, self.labels], sort_keys=True
        )
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _granted(alloc: list[str]) -> dict[str, float]:
    """Sum the "<cpus> <memory>" grants of the jobs on a node."""
    cpus = memory = 0.0
    for grant in alloc:
        c, _, m = grant.partition(" ")
        cpus, memory = cpus + float(c or 0), memory + float(m or 0)
    return {"used_cpus": cpus, "used_memory": int(memory)}


class NodeStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)

    @translated
    def heartbeat(self, name: str, agent_id: str, ttl_s: float, now: float, info: NodeInfo) -> bool:
        """Renew the node lease and publish ``info``; True when the node (re)joined. ``version_at``
        is the heartbeat's time, as ``heartbeat_at``: an agent that records no version (0.1.0)
        leaves it behind, so its node's ``version`` left by a newer agent reads as unknown."""
        at = repr(float(now))
        code, holder = self._scripts["heartbeat"](
            keys=self.heartbeat_keys(name),
            args=[agent_id, int(ttl_s * 1000), at, name, json.dumps({**info.fields(), "version_at": at})],
        )
        if code == -1:
            raise LeaseConflict(f"node {name!r} is held by agent {holder}; give each agent its own node_name")
        return bool(code == 1)

    def heartbeat_keys(self, name: str) -> list[str]:
        k = self.keys
        return [k.node_lease(name), k.node(name), k.nodes, k.nodes_version, k.nodes_changed]

    @translated
    def set_state(
        self,
        name: str,
        state: NodeState,
        reason: str,
        now: float,
        by: str = "",
        *,
        leader: str = "",
        only_from: Iterable[NodeState] = (),
        **extra: float | str,
    ) -> bool:
        """Set the admin state; ``extra`` fields (drain deadline, grace) are set too, or cleared.

        False when the state is not one of ``only_from`` (when given). A controller passes its
        ``leader`` value and is refused with :class:`NotLeader` unless it still holds the lease.
        """
        fields = {
            "state": state.value,
            "reason": reason,
            "changed_at": now,
            "changed_by": by,
            "drain_deadline": "",
            "drain_grace_s": "",
            **extra,
        }
        k = self.keys
        allowed = ",".join(s.value for s in only_from)
        changes = json.dumps({f: str(v) for f, v in fields.items()})
        code = self._scripts["node_state"](
            keys=[k.node(name), k.nodes, k.leader, k.nodes_version, k.nodes_changed],
            args=[name, leader, allowed, changes],
        )
        if code == -1:
            raise NotFound(f"no node {name!r} (list nodes with `fleet nodes`)")
        if code == -2:
            raise NotLeader(f"state of node {name} not set: another controller holds the leader lease")
        replicated(self.redis, self.keys, f"the state of node {name}")  # a cordon, a drain: acknowledged
        return bool(code == 1)

    @translated
    def names(self) -> list[str]:
        return sorted(self.redis.smembers(self.keys.nodes))

    @translated
    def changed_since(self, version: int) -> tuple[list[str], int]:
        """Nodes whose scheduling view changed after ``version`` (heartbeat digest, admin state, jobs
        placed or released), and the version now. A version now below ``version`` means the counter
        was reset (a Redis restored or flushed): the caller must read every node again."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.keys.nodes_version)
        pipe.zrangebyscore(self.keys.nodes_changed, f"({version}", "+inf")
        now, names = pipe.execute()
        return names, int(now or 0)

    @translated
    def alive(self, names: list[str]) -> dict[str, bool]:
        """Which of these nodes hold their lease (one command: what a lease expiry, which writes
        nothing, is noticed by)."""
        if not names:
            return {}
        leases = self.redis.mget([self.keys.node_lease(n) for n in names])
        return {n: lease is not None for n, lease in zip(names, leases, strict=True)}

    @translated
    def most_gpus(self) -> int:
        """The most GPUs one live node has (what ``fleet submit`` warns against), read without
        parsing whole node records."""
        names = self.names()
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.exists(self.keys.node_lease(name))
            pipe.hget(self.keys.node(name), "gpus")
        answers = pipe.execute()
        most = 0
        for alive, gpus in zip(answers[0::2], answers[1::2], strict=True):
            with contextlib.suppress(ValueError, TypeError):
                most = max(most, len(json.loads(gpus)) if alive and gpus else 0)
        return most

    @translated
    def versions(self) -> tuple[str | None, dict[str, str]]:
        """The leading controller's release (None while none leads) and each live node's agent's
        ("" for one that recorded none: 0.1.0 or older), read without parsing whole records."""
        names, wanted = self.names(), ("version", "version_at", "heartbeat_at")
        pipe = self.redis.pipeline(transaction=False)
        pipe.mget(self.keys.leader, self.keys.leader_version)
        for name in names:
            pipe.exists(self.keys.node_lease(name))
            pipe.hmget(self.keys.node(name), *wanted)
        (leader, controller), *rows = pipe.execute()
        nodes = {}
        for name, alive, fields in zip(names, rows[0::2], rows[1::2], strict=True):
            if alive:
                nodes[name] = node_version({k: v for k, v in zip(wanted, fields, strict=True) if v})
        return (controller or "") if leader else None, nodes

    def all(self) -> list[Node]:
        """Every node whose record can be read (see ``read_all`` for the others)."""
        return self.read_all().nodes

    def read_all(self) -> NodeBatch:
        return self.read(self.names())

    @translated
    def read(self, names: list[str], all_claims: bool = True) -> NodeBatch:
        """These nodes as stored (with their claims and the CPUs and memory granted on them). The
        batch's ``claims`` is the whole claims hash, or with ``all_claims=False`` (a few nodes out of
        many) only the claims of these nodes' GPUs, read in a second round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.node(name))
            pipe.exists(self.keys.node_lease(name))
            pipe.smembers(self.keys.node_jobs(name))
            pipe.hvals(self.keys.node_alloc(name))
        if all_claims:
            pipe.hgetall(self.keys.claims)
        pipe.hgetall(self.keys.quarantined_nodes)
        *rows, quarantined = pipe.execute()
        claims = rows.pop() if all_claims else self._claims_of(rows[0::4])
        nodes, corrupt, corrupt_alive = [], {}, set()
        for name, raw, alive, jobs, alloc in zip(names, *(rows[i::4] for i in range(4)), strict=True):
            if not raw:
                continue
            try:
                node = parse_node(name, raw, bool(alive), claims, sorted(jobs))
            except CorruptRecord as exc:
                corrupt[name] = str(exc)
                if alive:
                    corrupt_alive.add(name)
                continue
            nodes.append(node.model_copy(update=_granted(alloc)))
        return NodeBatch(nodes, corrupt, frozenset(corrupt_alive), quarantined, claims)

    def _claims_of(self, records: list[dict[str, str]]) -> dict[str, str]:
        uuids = []
        for raw in records:
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                uuids += [g["uuid"] for g in json.loads(raw.get("gpus") or "[]")]
        if not uuids:
            return {}
        return {u: c for u, c in zip(uuids, self.redis.hmget(self.keys.claims, uuids), strict=True) if c}

    def get(self, name: str) -> Node:
        batch = self.read_all()
        for node in batch.nodes:
            if node.name == name:
                return node
        if name in batch.quarantined:
            raise CorruptRecord(f"node {name} is quarantined: {batch.quarantined[name]}")
        if name in batch.corrupt:
            raise CorruptRecord(f"the record of node {name} cannot be read: {batch.corrupt[name]}")
        raise NotFound(f"no node {name!r} (list nodes with `fleet nodes`)")

    @translated
    def quarantine(self, name: str, reason: str, leader: str) -> bool:
        """Record why a node record cannot be read (leader only); True the first time, False after.
        An empty ``reason`` forgets the entry (the record is readable again)."""
        keys = [self.keys.quarantined_nodes, self.keys.leader]
        code = self._scripts["quarantine_node"](keys=keys, args=[name, reason, leader])
        if code == -2:
            raise NotLeader(f"quarantine of node {name} refused: another controller holds the leader lease")
        return bool(code == 1)
