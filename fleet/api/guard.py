"""What the API checks before it reads a request's body: a memory attack needs no token otherwise.

FastAPI reads and parses a JSON body before it runs a route's dependencies, the token check among
them, so a 300 MB POST with no token was read whole before it was refused. This ASGI middleware
runs first: a call that sends a body to ``/v1`` must carry a token the fleet knows (401 otherwise,
the body unread), and no body may exceed its route's limit (413): ``api.max_body_bytes`` for specs
and the like, ``workdir_max_bytes`` for a blob, 64 KiB for the status pages' forms. A body sent
without a length (chunked) is cut off at the limit too.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio.to_thread
from starlette.requests import Request

from fleet.api.deps import NO_TOKEN, UNKNOWN_TOKEN, bearer, remember
from fleet.errors import FleetError, SpecError, StoreUnavailable, Unauthorized, error_body
from fleet.state.tokens import TokenStore

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: a status page's form (the login's token) is small
FORM_MAX = 64 << 10
#: a refused body up to this size is read and dropped before the answer: a client still sending it
#: then reads the 413 that names the limit, not a broken pipe (the server closes once it answered)
DRAIN_MAX = 64 << 20


class Guard:
    def __init__(self, app: App, tokens: TokenStore, max_body: int, max_blob: int) -> None:
        self.app, self.tokens, self.max_body, self.max_blob = app, tokens, max_body, max_blob

    def limit(self, path: str) -> tuple[int, str]:
        if path.startswith("/v1/blobs/"):
            return self.max_blob, "workdir_max_bytes"
        if path.startswith("/v1/"):
            return self.max_body, "api.max_body_bytes"
        return FORM_MAX, "a form's limit"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if path.startswith("/v1/") and await self._refused(scope, send):
            return
        limit, setting = self.limit(path)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            if int(declared) <= DRAIN_MAX:
                await _drain(receive, more=True)
            await _answer(
                send, 413, SpecError(f"request body: {declared} bytes, more than {setting} ({limit})")
            )
            return
        if declared.isdigit():  # the server holds the client to its length: nothing more arrives
            await self.app(scope, receive, send)
            return
        body, more = bytearray(), True
        while more:  # no length given: read up to the limit, then hand the app what was read
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay(bytes(body), message), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await _drain(receive, more)
                await _answer(send, 413, SpecError(f"request body: more than {setting} ({limit}) bytes"))
                return
        await self.app(scope, _replay(bytes(body), None), send)

    async def _refused(self, scope: Scope, send: Send) -> bool:
        """Whether the call was answered for want of a token the fleet knows (401), or because no
        token can be checked while Redis is unavailable (503, as a route would answer)."""
        try:
            refused = await self._unknown_caller(scope)
        except StoreUnavailable as exc:
            await _answer(send, 503, exc)
            return True
        if refused is not None:
            await _answer(send, 401, refused, {"www-authenticate": "Bearer"})
        return refused is not None

    async def _unknown_caller(self, scope: Scope) -> FleetError | None:
        token = bearer(Request(scope))
        if not token:
            return Unauthorized(NO_TOKEN)
        who = await anyio.to_thread.run_sync(self.tokens.identify, token)
        if who is None:
            return Unauthorized(UNKNOWN_TOKEN)
        remember(scope, token, who)  # the route's dependency takes it from here: one read per call
        return None


async def _drain(receive: Receive, more: bool) -> None:
    """Read what is left of a refused body, up to ``DRAIN_MAX`` bytes, and drop it."""
    read = 0
    while more and read <= DRAIN_MAX:
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        more = message.get("more_body", False)


def _replay(body: bytes, then: Message | None) -> Receive:
    """A ``receive`` that hands over ``body`` once, then what the client sent next (a disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return then if then is not None else {"type": "http.disconnect"}

    return receive


async def _answer(send: Send, status: int, exc: FleetError, headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(error_body(exc)).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
    ]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
