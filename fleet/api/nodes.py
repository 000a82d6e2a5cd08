"""``/v1/nodes``, ``/v1/drain``, ``/v1/quarantine``, ``/v1/fleet``, ``/v1/version``: the machines, as
anyone may see them and as an operator changes them (cordon, uncordon, drain), and which release each
service runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from pydantic import BaseModel, Field

from fleet import __version__
from fleet.api.commands import Commands
from fleet.api.deps import Operator, StrictBody, User, sees_all
from fleet.api.queries import Queries
from fleet.models import FleetVersions, Identity, Node, RedisStatus, Role

#: what a user reads in place of another tenant's claim on a GPU: held, by whom not said
OTHERS = "another tenant's job"


class Cordon(StrictBody):
    reason: str = Field(default="", max_length=1024)


class Drain(StrictBody):
    names: list[str] = Field(min_length=1, max_length=10_000)
    deadline_s: float = Field(default=3600.0, ge=0)
    grace_s: float = Field(default=60.0, ge=0)
    force: bool = False
    reason: str = Field(default="", max_length=1024)


class Quarantine(BaseModel):
    jobs: dict[str, str]
    nodes: dict[str, str]


class FleetInfo(BaseModel):
    version: str
    most_gpus: int


def seen_by(backend: Queries, who: Identity, nodes: list[Node]) -> list[Node]:
    """``nodes`` as ``who`` may see them: a user sees its own tenant's jobs on them by name and
    another tenant's as a GPU held (``claims`` say OTHERS), never which job holds it."""
    if sees_all(who):
        return nodes
    own = {job.id for job in backend.on_nodes(who.tenant)}
    return [
        node.model_copy(
            update={
                "jobs": [j for j in node.jobs if j in own],
                "claims": {
                    gpu: c if c.rpartition(":")[0] in own else OTHERS for gpu, c in node.claims.items()
                },
            }
        )
        for node in nodes
    ]


def routes(backend: Commands) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/nodes")
    def nodes(who: User) -> list[Node]:
        return seen_by(backend, who, backend.nodes())

    @router.get("/v1/nodes/{name}")
    def node(name: str, who: User) -> Node:
        return seen_by(backend, who, [backend.node(name)])[0]

    @router.post("/v1/nodes/{name}/cordon")
    def cordon(name: str, who: Operator, body: Annotated[Cordon | None, Body()] = None) -> Node:
        return backend.cordon(name, body.reason if body else "", who=who.user)

    @router.post("/v1/nodes/{name}/uncordon")
    def uncordon(name: str, who: Operator) -> Node:
        return backend.uncordon(name, who=who.user)

    @router.post("/v1/drain")
    def drain(body: Drain, who: Operator) -> list[Node]:
        return backend.drain(
            body.names,
            deadline_s=body.deadline_s,
            grace_s=body.grace_s,
            force=body.force,
            reason=body.reason,
            who=who.user,
        )

    @router.get("/v1/quarantine")
    def quarantine(who: User) -> Quarantine:
        """Records fleet cannot read. A user sees only the nodes': an unreadable job names no tenant."""
        jobs = backend.quarantined_jobs() if who.role.allows(Role.OPERATOR) else {}
        return Quarantine(jobs=jobs, nodes=backend.quarantined_nodes())

    @router.get("/v1/fleet")
    def fleet_info(_: User) -> FleetInfo:
        return FleetInfo(version=__version__, most_gpus=backend.most_gpus())

    @router.get("/v1/redis")
    def redis_status(_: Operator) -> RedisStatus:
        """Which Redis is primary, its replicas and their lag, the sentinels that agree, and the
        failovers the services saw; read at most every few seconds. Operators' (it names hosts)."""
        return backend.redis_status()

    @router.get("/v1/version")
    def versions(_: User) -> FleetVersions:
        """This API server's release, the leading controller's and each live node's agent's, and
        ``mixed`` when they differ (a fleet part way through an upgrade)."""
        return backend.versions(__version__)

    return router
