"""Calls about the fleet itself rather than its jobs: nodes, tenants, webhooks, identities and tokens
(each declared once, as :mod:`fleet.client.endpoints` declares the jobs')."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.client import checks
from fleet.client.calls import Call, listed, node_segment, secret, segment, tenant_query
from fleet.errors import SpecError
from fleet.models import (
    FleetVersions,
    Identity,
    Node,
    RedisStatus,
    Role,
    Tenant,
    TenantStatus,
    TokenInfo,
    WebhookOutcome,
)

# -- nodes -----------------------------------------------------------------------------


def nodes() -> Call[list[Node]]:
    return Call("GET", "/v1/nodes", listed(Node))


def most_gpus() -> Call[int]:
    return Call("GET", "/v1/fleet", lambda data: int(data["most_gpus"]))


def versions() -> Call[FleetVersions]:
    return Call("GET", "/v1/version", FleetVersions.model_validate)


def redis_status() -> Call[RedisStatus]:
    return Call("GET", "/v1/redis", RedisStatus.model_validate)


def node(name: str) -> Call[Node]:
    return Call("GET", f"/v1/nodes/{node_segment(name)}", Node.model_validate)


def cordon(name: str, reason: str) -> Call[Node]:
    return Call("POST", f"/v1/nodes/{node_segment(name)}/cordon", Node.model_validate, {"reason": reason})


def uncordon(name: str) -> Call[Node]:
    return Call("POST", f"/v1/nodes/{node_segment(name)}/uncordon", Node.model_validate)


def drain(
    names: str | Sequence[str], deadline_s: float, grace_s: float, force: bool, reason: str
) -> Call[list[Node]]:
    body = {
        "names": checks.names(names),
        "deadline_s": checks.seconds(deadline_s, "deadline_s"),
        "grace_s": checks.seconds(grace_s, "grace_s"),
        "force": bool(force),
        "reason": reason,
    }
    return Call("POST", "/v1/drain", listed(Node), body)


# -- tenants ---------------------------------------------------------------------------


def tenants() -> Call[list[TenantStatus]]:
    return Call("GET", "/v1/tenants", listed(TenantStatus))


def set_tenant(name: str, policy: dict[str, Any]) -> Call[Tenant]:
    body = Tenant(name=name, **policy).model_dump(mode="json", exclude_unset=True, exclude={"name"})
    return Call("PUT", f"/v1/tenants/{segment(checks.ident(name, 'tenant'))}", Tenant.model_validate, body)


def delete_tenant(name: str) -> Call[Tenant]:
    return Call("DELETE", f"/v1/tenants/{segment(checks.ident(name, 'tenant'))}", Tenant.model_validate)


# -- webhooks --------------------------------------------------------------------------


def webhook_secret(tenant: str | None) -> Call[str]:
    return Call("GET", "/v1/webhooks/secret", secret, query=tenant_query(tenant))


def rotate_webhook_secret(tenant: str | None) -> Call[str]:
    return Call("POST", "/v1/webhooks/secret/rotate", secret, query=tenant_query(tenant))


def webhook_deliveries(tenant: str | None, limit: int) -> Call[list[WebhookOutcome]]:
    query = tenant_query(tenant) | {"limit": checks.count(limit, "limit", 1, 1000)}
    return Call("GET", "/v1/webhooks/deliveries", listed(WebhookOutcome), query=query)


# -- identities ------------------------------------------------------------------------


def whoami() -> Call[Identity]:
    return Call("GET", "/v1/whoami", Identity.model_validate)


def create_token(
    user: str, tenant: str, role: Role | str, expires_in_s: float | None
) -> Call[tuple[str, TokenInfo]]:
    if str(role) not in {r.value for r in Role}:
        raise SpecError(f"role {role!r}: expected one of {', '.join(r.value for r in Role)}")
    body = {
        "user": checks.ident(user, "user"),
        "tenant": checks.ident(tenant, "tenant"),
        "role": str(role),
        "expires_in_s": checks.seconds(expires_in_s, "expires_in_s"),
    }
    return Call(
        "POST", "/v1/tokens", lambda data: (data["token"], TokenInfo.model_validate(data["info"])), body
    )


def tokens() -> Call[list[TokenInfo]]:
    return Call("GET", "/v1/tokens", listed(TokenInfo))


def revoke_token(token_id: str) -> Call[TokenInfo]:
    return Call(
        "DELETE", f"/v1/tokens/{segment(checks.ident(token_id, 'token id'))}", TokenInfo.model_validate
    )
