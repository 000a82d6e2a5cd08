"""Who is calling, and what it may do: the token checks every route depends on.

The API (``/v1``) takes a token only from the ``Authorization`` header, so no browser sends one on a
user's behalf and its POSTs need no CSRF defence. The status pages (``/ui``) also take it from the
cookie their login sets: they only read, and the cookie is HttpOnly, SameSite=Strict and sent to
``/ui`` alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from fleet.errors import Forbidden, NotFound, Unauthorized
from fleet.models import Identity, Role
from fleet.state.tokens import TokenStore


class StrictBody(BaseModel):
    """A call's JSON body: a key it does not define is refused (422 naming it), never dropped unread
    (a misspelt ``max_runing`` would otherwise leave its default in force, unnoticed)."""

    model_config = ConfigDict(extra="forbid")


#: the status pages' cookie holding the token (path /ui)
COOKIE = "fleet_token"
NO_TOKEN = "no token: send 'Authorization: Bearer <token>' (fleet login, or FLEET_TOKEN)"
UNKNOWN_TOKEN = "token unknown, revoked or expired: ask an admin for a new one (fleet token create)"
#: where :class:`fleet.api.guard.Guard` leaves the identity it found for a call's token (in the ASGI
#: scope's ``state``), so the route's dependency does not read the token's record a second time
IDENTITY = "fleet_identity"


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


def remember(scope: Any, token: str, who: Identity) -> None:
    """Keep who ``token`` is for the rest of this call (the guard found it before the body was read)."""
    scope.setdefault("state", {})[IDENTITY] = (token, who)


async def caller(request: Request) -> Identity:
    """The caller by its bearer token: the identity the guard found for a call with a body, else
    read on a worker thread (a token check is a Redis read)."""
    token = bearer(request)
    if not token:
        raise Unauthorized(NO_TOKEN)
    known = request.scope.get("state", {}).get(IDENTITY)
    if known is not None and known[0] == token:
        return known[1]  # type: ignore[no-any-return]
    return await run_in_threadpool(identify, request, token)


async def page_caller(request: Request) -> Identity:
    """The caller of a status page: by its header, else by the cookie the login page set."""
    if bearer(request):
        return await caller(request)
    token = request.cookies.get(COOKIE, "")
    if not token:
        raise Unauthorized("not logged in: log in with a token")
    return await run_in_threadpool(identify, request, token)


def role(
    needed: Role, who_is: Callable[[Request], Awaitable[Identity]] = caller
) -> Callable[[Identity], Awaitable[Identity]]:
    """A dependency: the caller, if its role is ``needed`` or higher; else :class:`Forbidden`.
    Coroutines, so that no call spends a worker thread on them."""

    identified = Depends(who_is)  # a default, not an annotation: annotations are strings, read as globals

    async def check(who: Identity = identified) -> Identity:
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


def own_job(who: Identity, tenant: str, job_id: str) -> None:
    """A user reads and acts on its tenant's jobs only; another tenant's job is answered as a missing
    one (404, the same words), so a user learns nothing of it, not even that it exists."""
    if who.role == Role.USER and tenant != who.tenant:
        raise NotFound(f"no job {job_id!r} (list jobs with `fleet jobs`)")


def own_array(who: Identity, tenant: str, array_id: str) -> None:
    """:func:`own_job` for a job array."""
    if who.role == Role.USER and tenant != who.tenant:
        raise NotFound(f"no job or job array {array_id!r} (list them with `fleet jobs`)")


def sees_all(who: Identity) -> bool:
    """Whether ``who`` reads every tenant's jobs (operators and admins), not only its own tenant's."""
    return who.role.allows(Role.OPERATOR)


ACTS = {
    Role.USER: "use the fleet",
    Role.OPERATOR: "cordon, uncordon or drain nodes",
    Role.ADMIN: "manage tokens or tenants",
}


def whom(who: Identity) -> str:
    return f"the token of user {who.user!r} (role {who.role})"
