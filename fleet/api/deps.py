"""Who is calling, and what it may do: the token checks every route depends on.

The API (``/v1``) takes a token only from the ``Authorization`` header, so no browser sends one on a
user's behalf and its POSTs need no CSRF defence. The status pages (``/ui``) also take it from the
cookie their login sets: they only read, and the cookie is HttpOnly, SameSite=Strict and sent to
``/ui`` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from fleet.errors import Forbidden, Unauthorized
from fleet.models import Identity, Role
from fleet.state.tokens import TokenStore

#: the status pages' cookie holding the token (path /ui)
COOKIE = "fleet_token"
NO_TOKEN = "no token: send 'Authorization: Bearer <token>' (fleet login, or FLEET_TOKEN)"
UNKNOWN_TOKEN = "token unknown, revoked or expired: ask an admin for a new one (fleet token create)"


def identify(request: Request, token: str) -> Identity:
    """Who ``token`` belongs to; :class:`Unauthorized` if nobody (unknown, revoked or expired)."""
    tokens: TokenStore = request.app.state.tokens
    who = tokens.identify(token.strip())
    if who is None:
        raise Unauthorized(UNKNOWN_TOKEN)
    return who


def bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def caller(request: Request) -> Identity:
    token = bearer(request)
    if not token:
        raise Unauthorized(NO_TOKEN)
    return identify(request, token)


def page_caller(request: Request) -> Identity:
    """The caller of a status page: by its header, else by the cookie the login page set."""
    token = bearer(request) or request.cookies.get(COOKIE, "")
    if not token:
        raise Unauthorized("not logged in: log in with a token")
    return identify(request, token)


def role(needed: Role, who_is: Callable[[Request], Identity] = caller) -> Callable[[Identity], Identity]:
    """A dependency: the caller, if its role is ``needed`` or higher; else :class:`Forbidden`."""

    identified = Depends(who_is)  # a default, not an annotation: annotations are strings, read as globals

    def check(who: Identity = identified) -> Identity:
        if not who.role.allows(needed):
            raise Forbidden(f"{whom(who)} cannot {ACTS[needed]}: that needs role {needed} or higher")
        return who

    return check


Anyone = Annotated[Identity, Depends(caller)]
User = Annotated[Identity, Depends(role(Role.USER))]
Operator = Annotated[Identity, Depends(role(Role.OPERATOR))]
Admin = Annotated[Identity, Depends(role(Role.ADMIN))]
#: a status page's reader: any role, by header or cookie
Reader = Annotated[Identity, Depends(role(Role.USER, page_caller))]


def own(who: Identity, tenant: str, what: str) -> None:
    """A user acts within its tenant only; operators and admins read and cancel any tenant's."""
    if who.role == Role.USER and tenant != who.tenant:
        raise Forbidden(
            f"{what} belongs to tenant {tenant!r}; {whom(who)} acts for tenant {who.tenant!r} only"
        )


def sees_all(who: Identity) -> bool:
    """Whether ``who`` reads every tenant's jobs (operators and admins), not only its own tenant's."""
    return who.role.allows(Role.OPERATOR)


ACTS = {Role.USER: "use the fleet", Role.OPERATOR: "cordon, uncordon or drain nodes",
        Role.ADMIN: "manage tokens or tenants"}  # fmt: skip


def whom(who: Identity) -> str:
    return f"the token of user {who.user!r} (role {who.role})"
