"""``/v1/webhooks``: a tenant's signing secret and how its deliveries went (see :mod:`fleet.webhooks`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from fleet.api.deps import Admin, User, own, whom
from fleet.errors import Forbidden
from fleet.models import TENANT_NAME, Role, WebhookOutcome
from fleet.state.webhooks import WebhookStore

Tenant = Annotated[str | None, Query(pattern=TENANT_NAME, description="default: the caller's tenant")]


class WebhookSecret(BaseModel):
    tenant: str
    #: the key of every delivery's X-Fleet-Signature-256 (HMAC-SHA256 of the body)
    secret: str


def routes(hooks: WebhookStore) -> APIRouter:
    router = APIRouter(prefix="/v1/webhooks")

    @router.get("/secret")
    def secret(who: User, tenant: Tenant = None) -> WebhookSecret:
        """The secret the tenant's deliveries are signed with: its users see their own tenant's, an
        admin any tenant's. Made on first use."""
        name = tenant or who.tenant
        if who.role != Role.ADMIN and name != who.tenant:
            raise Forbidden(
                f"the webhook secret of tenant {name!r}: {whom(who)} reads its own tenant's "
                f"({who.tenant!r}) only; an admin reads any"
            )
        return WebhookSecret(tenant=name, secret=hooks.secret(name))

    @router.post("/secret/rotate")
    def rotate(who: Admin, tenant: Tenant = None) -> WebhookSecret:
        """A new secret for the tenant (admins): deliveries are signed with it from now on."""
        name = tenant or who.tenant
        return WebhookSecret(tenant=name, secret=hooks.rotate(name))

    @router.get("/deliveries")
    def deliveries(
        who: User, tenant: Tenant = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> list[WebhookOutcome]:
        """How the newest delivery attempts went, newest first: a user's tenant's; an operator's
        every tenant's (or ``tenant``'s)."""
        if who.role == Role.USER:
            own(who, tenant or who.tenant, f"the webhook deliveries of tenant {tenant!r}")
            tenant = who.tenant
        return hooks.outcomes(tenant, limit)

    return router
