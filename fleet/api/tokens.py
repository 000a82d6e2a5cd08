"""``/v1/whoami`` and ``/v1/tokens``: who a token is, and the tokens an admin issues and revokes."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fleet.api.deps import Admin, Anyone, StrictBody
from fleet.errors import NotFound
from fleet.log import event
from fleet.models import Identity, Role, TokenInfo
from fleet.state.tenants import TenantStore
from fleet.state.tokens import TokenStore

log = logging.getLogger("fleet.api")


class NewToken(StrictBody):
    user: str
    tenant: str
    role: Role = Role.USER
    expires_in_s: float | None = Field(default=None, gt=0)


class IssuedToken(BaseModel):
    token: str
    info: TokenInfo


def routes(tokens: TokenStore, tenants: TenantStore) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/whoami")
    def whoami(who: Anyone) -> Identity:
        return who

    @router.post("/v1/tokens", status_code=201)
    def create_token(body: NewToken, who: Admin) -> IssuedToken:
        """A token for a user of a tenant that exists (``fleet tenant set`` creates one)."""
        tenants.check(body.tenant)
        token, info = tokens.create(
            body.user, body.tenant, body.role, expires_in_s=body.expires_in_s, created_by=who.user
        )
        event(
            log, "token_created", id=info.id, user=info.user, tenant=info.tenant, role=info.role, by=who.user
        )
        return IssuedToken(token=token, info=info)

    @router.get("/v1/tokens")
    def list_tokens(_: Admin) -> list[TokenInfo]:
        return tokens.all()

    @router.delete("/v1/tokens/{token_id}")
    def revoke_token(token_id: str, who: Admin) -> TokenInfo:
        found = next((t for t in tokens.all() if t.id == token_id), None)
        if found is None or not tokens.revoke(token_id):
            raise NotFound(f"no token {token_id!r} (fleet token list shows them)")
        event(log, "token_revoked", id=token_id, by=who.user)
        return found

    return router
