"""``/v1/tenants``: every tenant's policy and standing for anyone, set and deleted by an admin."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from fleet.api import webhooks
from fleet.api.deps import Admin, User
from fleet.log import event
from fleet.models import Role, Tenant, TenantStatus
from fleet.state.tenants import TenantStore

if TYPE_CHECKING:
    from fleet.backend import Backend

log = logging.getLogger("fleet.api")


def routes(tenants: TenantStore, backend: Backend) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/tenants")
    def tenant_list(who: User) -> list[TenantStatus]:
        """Every tenant's policy, use, fair share and decayed usage: what anyone waiting may see, to
        know why (no job of another tenant is named, nor another tenant's webhook URL)."""
        return [webhooks.redacted(t, who.tenant, who.role == Role.ADMIN) for t in tenants.status()]

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
