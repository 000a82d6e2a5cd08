"""Job and node records as stored in Redis hashes, parsed into models.

A record that cannot be parsed (a hand-edited hash, a field written by a buggy or newer
version) raises :class:`CorruptRecord` naming the field and what is wrong with it, so that
readers skip that one record instead of failing for the whole fleet, and the controller can
quarantine it with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from fleet.errors import CorruptRecord, JobExpired
from fleet.models import (
    SPEED_KEY,
    Exit,
    Gpu,
    Job,
    JobArray,
    JobSpec,
    JobState,
    Member,
    Node,
    NodeState,
    Progress,
)
from fleet.models.arrays import ARRAY_LABEL, INDEX_LABEL

T = TypeVar("T")


@dataclass(frozen=True)
class JobBatch:
    """Jobs read in one go: those that parsed, and why each of the others did not (id -> reason)."""

    jobs: list[Job] = field(default_factory=list)
    corrupt: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeBatch:
    """Nodes read in one go: those that parsed; name -> reason for the others, and which of those
    still hold a live lease; name -> reason for nodes already quarantined; the GPU claims hash."""

    nodes: list[Node] = field(default_factory=list)
    corrupt: dict[str, str] = field(default_factory=dict)
    corrupt_alive: frozenset[str] = frozenset()
    quarantined: dict[str, str] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)

    def merged(self, other: NodeBatch) -> NodeBatch:
        """Both batches as one (of different nodes, read one after the other)."""
        return NodeBatch(
            nodes=[*self.nodes, *other.nodes],
            corrupt={**self.corrupt, **other.corrupt},
            corrupt_alive=self.corrupt_alive | other.corrupt_alive,
            quarantined={**self.quarantined, **other.quarantined},
            claims={**self.claims, **other.claims},
        )


def why(exc: Exception) -> str:
    """One short line for a parse error (pydantic's are several lines long)."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    parts = []
    for err in exc.errors()[:2]:
        loc = ".".join(map(str, err["loc"]))
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


class _Fields:
    """Reads one hash field by field, so that an error names the field it comes from."""

    def __init__(self, raw: dict[str, str]) -> None:
        self.raw = raw

    def get(self, name: str, parse: Callable[[str], T], default: T) -> T:
        value = self.raw.get(name)
        if value is None or value == "":
            return default
        return self.required(name, parse)

    def required(self, name: str, parse: Callable[[str], T]) -> T:
        value = self.raw.get(name)
        if value is None:
            raise CorruptRecord(f"{name}: missing")
        try:
            return parse(value)
        except (ValueError, TypeError) as exc:  # ValidationError and JSONDecodeError are ValueErrors
            raise CorruptRecord(f"{name}: {why(exc)}") from None


def _gpus(text: str) -> list[Gpu]:
    return [Gpu.model_validate(g) for g in json.loads(text)]


def _members(text: str) -> list[Member]:
    """``[[node, [uuids]], ...]`` as place_many.lua writes it (Lua encodes an empty list as {})."""
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError("expected a JSON list of [node, [GPU UUIDs]]")
    return [Member(node=node, gpus=list(gpus or [])) for node, gpus in value]


def _labels(text: str) -> dict[str, str]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object of labels")
    return {str(k): str(v) for k, v in value.items()}


def _uuids(text: str) -> list[str]:
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
        raise ValueError("expected a JSON list of GPU UUIDs")
    return value


def parse_job(raw: dict[str, str], arrays: Mapping[str, JobArray] | None = None) -> Job:
    """The job in ``raw``; a task of a job array takes its spec from its record in ``arrays``."""
    try:
        return _job(_Fields(raw), arrays or {})
    except ValidationError as exc:
        raise CorruptRecord(why(exc)) from None


def _job(f: _Fields, arrays: Mapping[str, JobArray]) -> Job:
    raw = f.raw
    created = f.get("created_at", float, 0.0)
    updated = f.get("updated_at", float, None) or created
    return Job(
        id=f.required("id", str),
        state=f.required("state", JobState),
        attempt=f.get("attempt", int, 0),
        failures=f.get("failures", int, 0),
        infra_requeues=f.get("infra_requeues", int, 0),
        node=raw.get("node") or None,
        gpus=f.get("gpus", _uuids, None) or [],
        reason=raw.get("reason", ""),
        exit_code=f.get("exit_code", int, None),
        created_at=created,
        updated_at=updated,
        started_at=f.get("started_at", float, None),
        finished_at=f.get("finished_at", float, None),
        not_before=f.get("not_before", float, 0.0),
        cancel_requested=raw.get("cancel_requested") == "1",
        held_by=raw.get("held_by", ""),
        rev=f.get("rev", int, 0),
        preempt=raw.get("preempt", ""),
        preempted_for=raw.get("preempted_for", ""),
        checkpoint=raw.get("checkpoint") or None,
        outputs_bytes=f.get("outputs_bytes", int, None),
        outputs_attempt=f.get("outputs_attempt", int, 0),
        outputs_note=raw.get("outputs_note", ""),
        progress=_progress(raw.get("progress"), f.get("attempt", int, 0)),
        seq=f.get("seq", int, 0),
        state_since=f.get("state_since", float, None) or updated,
        members=f.get("members", _members, None) or [],
        master_addr=raw.get("master_addr", ""),
        master_port=f.get("master_port", int, 0),
        members_running=f.get("members_running", int, 0),
        members_done=f.get("members_done", int, 0),
        member_phases=[
            raw.get(f"m{rank}", "") for rank in range(len(f.get("members", _members, None) or []))
        ],
        num_gpus=f.get("num_gpus", int, 0),
        batch_size=f.get("batch_size", int, 0),
        sized_at=f.get("sized_at", float, 0.0),
        resizes=f.get("resizes", int, 0),
        resize_gpus=f.get("resize_gpus", int, None),
        resize_batch=f.get("resize_batch", int, 0),
        speeds=_speeds(raw.get("speeds")),
        noise_scale=f.get("gns", float, 0.0),
        used_gpu_s=f.get("acct_gpu_s", float, 0.0),
        running_from=f.get("run_from", float, None),
        **(f.get("exit", _last_exit, None) or {}),
        **_spec(f, arrays),
    )


def _spec(f: _Fields, arrays: Mapping[str, JobArray]) -> dict[str, Any]:
    """A job's own spec and owner; or, for a task, its array's, with the labels linking it to the array."""
    array_id = f.raw.get("array")
    if not array_id:
        return {"spec": f.required("spec", JobSpec.model_validate_json), "owner": f.raw.get("owner", "")}
    index = f.required("index", int)
    array = arrays.get(array_id)
    if array is None:
        raise CorruptRecord(f"array: the record of array {array_id} is missing or unreadable")
    labels = {**array.spec.labels, ARRAY_LABEL: array_id, INDEX_LABEL: str(index)}
    return {
        "spec": array.spec.model_copy(update={"labels": labels}),
        "array_id": array_id,
        "owner": array.owner,
        "array_index": index,
        "array_max_running": array.max_running,
    }


def parse_array(raw: dict[str, str], spec: JobSpec | None = None) -> JobArray:
    """The array record in ``raw`` (task counts not filled in); ``spec``: its spec, already parsed."""
    f = _Fields(raw)
    try:
        return JobArray(
            id=f.required("id", str),
            spec=spec or f.required("spec", JobSpec.model_validate_json),
            indices=f.required("indices", str),
            size=f.required("size", int),
            max_running=f.get("max_running", int, None),
            owner=f.raw.get("owner", ""),
            created_at=f.get("created_at", float, 0.0),
            seq=f.get("seq", int, 0),
        )
    except ValidationError as exc:
        raise CorruptRecord(why(exc)) from None


def _progress(text: str | None, attempt: int) -> Progress | None:
    """The last report of the job's latest attempt: one from an earlier attempt is not shown (a new
    attempt starts without one). Unreadable: none (a report is a hint, never a reason to quarantine)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return Progress.model_validate(data) if data.pop("attempt", None) == attempt else None
    except (ValueError, TypeError, AttributeError):
        return None


def _speeds(text: str | None) -> dict[str, float]:
    """What progress.lua kept of an elastic job's reports; unreadable: none (a hint, as progress)."""
    try:
        data = json.loads(text) if text else {}
        if not isinstance(data, dict):
            return {}
        return {k: float(v) for k, v in data.items() if SPEED_KEY.fullmatch(str(k))}
    except (ValueError, TypeError):
        return {}


def _last_exit(text: str) -> dict[str, Any]:
    """How an attempt ended, as the agent recorded it before removing the attempt."""
    data = json.loads(text)
    return {"last_exit_attempt": int(data.pop("attempt", 0)), "last_exit": Exit.model_validate(data)}


def parse_tombstone(job_id: str, text: str) -> JobExpired:
    """What a deleted job's tombstone (expire_jobs.lua) says, as the error a reader of the job gets."""
    try:
        data = json.loads(text)
        return JobExpired(job_id, str(data["state"]), float(data["ended_at"]), float(data["expired_at"]))
    except (ValueError, TypeError, KeyError):
        return JobExpired(job_id)


def parse_node(name: str, raw: dict[str, str], alive: bool, claims: dict[str, str], jobs: list[str]) -> Node:
    try:
        return _node(name, _Fields(raw), alive, claims, jobs)
    except ValidationError as exc:
        raise CorruptRecord(why(exc)) from None


def _node(name: str, f: _Fields, alive: bool, claims: dict[str, str], jobs: list[str]) -> Node:
    raw = f.raw
    gpus = f.get("gpus", _gpus, None) or []
    admin = f.get("state", NodeState, NodeState.READY)
    return Node(
        name=name,
        state=admin if alive else NodeState.DOWN,
        admin_state=admin,
        alive=alive,
        reason=raw.get("reason", "") if alive else "lease expired (no heartbeat)",
        heartbeat_at=f.get("heartbeat_at", float, 0.0),
        gpus=gpus,
        cpus=f.get("cpus", float, 0.0),
        memory=f.get("memory", int, 0),
        runtime=raw.get("runtime", ""),
        gpu_backend=raw.get("gpu_backend", ""),
        address=raw.get("address", ""),
        labels=f.get("labels", _labels, None) or {},
        claims={g.uuid: claims[g.uuid] for g in gpus if g.uuid in claims},
        changed_at=f.get("changed_at", float, 0.0),
        changed_by=raw.get("changed_by", ""),
        drain_deadline=f.get("drain_deadline", float, None),
        drain_grace_s=f.get("drain_grace_s", float, 0.0),
        jobs=jobs,
        version=node_version(raw),
    )


def node_version(raw: dict[str, str]) -> str:
    """The release of the agent that last heartbeated: "" when it recorded none (0.1.0 or older),
    also when the version on record was left by another agent's heartbeat (see fleet.versions)."""
    version = raw.get("version", "")
    return version if version and raw.get("version_at") == raw.get("heartbeat_at") else ""
