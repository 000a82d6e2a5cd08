"""``/v1/tenants``: every tenant's policy and standing for anyone, set and deleted by an admin."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from fleet.api.deps import Admin, User
from fleet.log import event
from fleet.models import Role, Tenant, TenantStatus
from fleet.state.tenants import TenantStore
from fleet.webhooks import shown_url

if TYPE_CHECKING:
    from fleet.api.commands import Commands

log = logging.getLogger("fleet.api")


def routes(tenants: TenantStore, backend: Commands) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/tenants")
    def tenant_list(who: User) -> list[TenantStatus]:
        """Every tenant's policy, use, fair share and decayed usage: what anyone waiting may see, to
        know why (no job of another tenant is named; see :func:`as_seen_by`)."""
        return [as_seen_by(t, who.tenant, who.role == Role.ADMIN) for t in tenants.status()]

    @router.put("/v1/tenants/{name}")
    def tenant_set(name: str, body: dict[str, Any], who: Admin) -> Tenant:
        tenant = Tenant.parse({**body, "name": name})
        backend.check_webhook(tenant.webhook)
        tenants.set(tenant)
        event(log, "tenant_set", tenant=name, by=who.user, **tenant.model_dump(exclude={"name"}))
        return tenant

    @router.delete("/v1/tenants/{name}")
    def tenant_delete(name: str, who: Admin) -> Tenant:
        """Forget a tenant's policy: its jobs get the default one (no guarantee, no limit, weight 1)."""
        tenant = tenants.get(name)
        tenants.delete(name)
        event(log, "tenant_deleted", tenant=name, by=who.user)
        return tenant

    return router


def as_seen_by(status: TenantStatus, reader_tenant: str, admin: bool) -> TenantStatus:
    """A tenant's status as another tenant's user may see it: its webhook's scheme and host only
    (the URL of a Slack webhook is what lets anyone post to the channel), and not which host users
    its jobs may run as (``allowed_users``: the accounts an attack on a node would aim at)."""
    tenant = status.tenant
    if admin or tenant.name == reader_tenant:
        return status
    update: dict[str, Any] = {"allowed_users": []}
    if tenant.webhook is not None:
        update["webhook"] = tenant.webhook.model_copy(update={"url": shown_url(tenant.webhook.url)})
    return status.model_copy(update={"tenant": tenant.model_copy(update=update)})
