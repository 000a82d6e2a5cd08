"""``fleet api``: the front door. Every call names a bearer token; the API checks who it is, what
its role allows and which tenant it acts for, then calls :class:`fleet.api.backend.Backend`
(its reads, :mod:`fleet.api.queries`, and writes, :mod:`fleet.api.commands`).

Stateless: every answer comes from Redis, so several servers may run behind a load balancer.
One router per resource, each a module (``jobs``, ``control`` (hold, release, update, cancel
several, requeue), ``outputs`` (kept outputs, checkpoints), ``history`` (accounting), ``blobs``,
``nodes``, ``tenants``, ``tokens``, ``webhooks``); it also serves the read-only status pages under
``/ui`` (:mod:`fleet.api.pages`).
Calls run on worker threads (``api.threads`` at once), except waits for a job and followed logs:
those wait on the event loop, woken by the process's one blocking read of the streams they watch
(:mod:`fleet.api.waiting`), holding neither a thread nor a Redis connection meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet import __version__
from fleet.api import blobs as blob_routes
from fleet.api import control, jobs, nodes, outputs, pages, shell, stdin, webhooks
from fleet.api import history as history_routes
from fleet.api import tenants as tenant_routes
from fleet.api import tokens as token_routes
from fleet.api.backend import Backend
from fleet.api.guard import Guard
from fleet.api.limits import PerToken
from fleet.api.waiting import Waiting
from fleet.config import Settings
from fleet.errors import (
    CorruptRecord,
    FleetError,
    Forbidden,
    JobExpired,
    JobTimeout,
    NotFound,
    SpecError,
    StoreUnavailable,
    TooManyRequests,
    Unauthorized,
    error_body,
)
from fleet.models.base import in_words
from fleet.state.connection import connect_binary
from fleet.state.shells import ShellRelay
from fleet.state.stdin import StdinStreams
from fleet.state.watch import StreamWatch
from fleet.versions import HEADER

STATUS: dict[type[FleetError], int] = {
    TooManyRequests: 429,
    Unauthorized: 401,
    Forbidden: 403,
    JobExpired: 410,
    CorruptRecord: 409,
    NotFound: 404,
    SpecError: 400,
    JobTimeout: 408,
    StoreUnavailable: 503,
}


def status_of(exc: FleetError) -> int:
    return next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 400)


# -- the app ---------------------------------------------------------------------------------


def create_app(settings: Settings) -> FastAPI:
    backend = Backend(settings=settings, connections=settings.api.redis_connections, background_hints=True)
    stores = backend.stores
    tokens, tenants, blobs, hooks = stores.tokens, stores.tenants, stores.blobs, stores.webhooks
    watch = StreamWatch(settings, stores.keys, stores.redis)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api.threads
        yield
        watch.close()
        backend.close()

    app = FastAPI(
        title="fleet",
        version=__version__,
        lifespan=lifespan,
        description="A serverless-style job queue for your own GPU fleet.",
    )
    app.state.tokens = tokens

    @app.exception_handler(FleetError)
    async def fleet_error(request: Request, exc: FleetError) -> Response:
        if pages.is_page(request):
            return pages.error_page(request, exc, status_of(exc))
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {_said(e)}" for e in exc.errors()
        )
        return error_response(SpecError(f"bad request: {fields}"))

    app.add_middleware(VersionHeader)
    waits, waiting = PerToken(settings.api.max_waits_per_token), Waiting(backend, watch)
    relay = ShellRelay(connect_binary(settings), stores.keys)
    streams = StdinStreams(relay.redis, stores.keys)
    for router in (
        jobs.routes(backend, blobs, waits, waiting),
        shell.routes(backend, relay, tokens, waits, waiting),
        stdin.routes(backend, streams),
        control.routes(backend),
        blob_routes.routes(blobs, settings),
        outputs.routes(backend, settings),
        nodes.routes(backend),
        tenant_routes.routes(tenants, backend),
        token_routes.routes(tokens, tenants),
        webhooks.routes(hooks),
        history_routes.routes(stores.accounting),
        pages.page_routes(backend, tenants),
    ):
        app.include_router(router)
    app.add_middleware(
        Guard, tokens=tokens, max_body=settings.api.max_body_bytes, max_blob=settings.workdir_max_bytes
    )
    return app


class VersionHeader:
    """Every answer names the API's release (``Fleet-Version``), errors too: a client without a
    token still learns which release it talks to (``fleet version``). Plain ASGI, so streamed answers
    (followed logs) stream as before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (HEADER.lower().encode(), __version__.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, send_with_version)


def _said(error: dict[str, Any]) -> str:
    """What is wrong with one field of a request; a key the call does not define named as such."""
    if error["type"] == "extra_forbidden":
        return "not a field of this call: leave it out (misspelt?)"
    if error["type"] == "string_pattern_mismatch":
        return f"must be {in_words(str(error.get('ctx', {}).get('pattern', '')))}"
    return str(error["msg"])


def error_response(exc: FleetError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    return JSONResponse(error_body(exc), status_code=status_of(exc), headers=headers)
