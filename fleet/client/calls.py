"""A call of the fleet API as the clients send it (:class:`Call`), and how answers are read: the
parts every module of calls shares (:mod:`fleet.client.endpoints`: jobs and blobs;
:mod:`fleet.client.fleet_endpoints`: nodes, tenants, webhooks, identities).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from fleet.client import checks
from fleet.models import FROM_FLEET, Job, JobArray, JobSpec

R = TypeVar("R")
#: what the API returns, fleet stored: an array task's spec carries the fleet.* labels a submit may not
STORED = {FROM_FLEET: True}


@dataclass(frozen=True)
class Call(Generic[R]):
    """One request, and how its JSON answer becomes what the client returns."""

    method: str
    path: str
    parse: Callable[[Any], R]
    body: Any = None
    query: dict[str, Any] | None = None
    timeout: float | None = None


def job(data: Any) -> Job:
    return Job.model_validate(data, context=STORED)


def array(data: Any) -> JobArray:
    return JobArray.model_validate(data, context=STORED)


def spec_body(spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
    """A spec as the API takes it: fields the caller set (so the tenant defaults to the token's)."""
    if isinstance(spec, JobSpec):
        return spec.model_dump(mode="json", exclude_unset=True)
    return spec


def waiting(body: dict[str, Any], deps: list[object]) -> dict[str, Any]:
    """A spec's body that waits for ``deps`` too (``after=``, checked), after its own ``after``."""
    return {**body, "after": [*body.get("after", []), *deps]} if deps else body


def entries(rows: Any) -> list[Job | JobArray]:
    return [array(r) if r.get("kind") == "array" else job(r) for r in rows]


def listed(model: Any) -> Callable[[Any], list[Any]]:
    return lambda rows: [model.model_validate(row) for row in rows]


def secret(data: Any) -> str:
    return str(data["secret"])


def tenant_query(tenant: str | None) -> dict[str, Any]:
    return {"tenant": None if tenant is None else checks.ident(tenant, "tenant")}


def job_segment(job_id: str) -> str:
    return segment(checks.ident(job_id))


def node_segment(name: str) -> str:
    return segment(checks.ident(name, "node"))


def segment(value: str) -> str:
    """An id as one path segment: anything that is not a plain name cannot name a job or node."""
    return quote(str(value), safe="")
