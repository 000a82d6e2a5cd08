"""The status pages under ``/ui``: read-only HTML, rendered on the server from the same Queries calls
the API makes, scoped to the caller's tenant exactly as the API scopes it.

A reader logs in by posting a token; the answer sets it in an HttpOnly, SameSite=Strict cookie for
``/ui`` (Secure over HTTPS). Every page is a GET that changes nothing; the only POSTs, login and
logout, refuse another site's origin. Pages refresh themselves with ``refresh.js`` (a fetch of the
same page every few seconds), so no script is inline and the Content-Security-Policy allows none.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlsplit

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape

from fleet.api import views
from fleet.api.deps import COOKIE, Reader, identify, own_array, own_job, sees_all
from fleet.api.queries import Queries
from fleet.errors import CorruptRecord, FleetError, JobExpired, NotFound, Unauthorized
from fleet.models import Identity, JobState, Role
from fleet.scheduler.goodput import job_goodput
from fleet.state.tenants import TenantStore
from fleet.text import ago, countdown, ordinal, redis_line, size, stamp, took
from fleet.versions import OLDEST, VERSION

PREFIX = "/ui"
#: seconds between a page's refreshes
REFRESH_S = 5
#: log lines a job's page shows (the end of its latest attempt)
LOG_TAIL = 100
#: queued jobs listed per tenant (the count says how many more wait)
QUEUE_SHOWN = 100
#: bytes a login form may post (a token is under 100)
FORM_MAX = 4096
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; style-src "
    "'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}

_env = Environment(
    loader=PackageLoader("fleet.api", "templates"),
    autoescape=select_autoescape(),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(ago=ago, stamp=stamp, size=size, duration=took, ordinal=ordinal)
templates = Jinja2Templates(env=_env)


def is_page(request: Request) -> bool:
    path = request.url.path
    return path == PREFIX or path.startswith(PREFIX + "/")


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("refresh_s", 0)
    context.setdefault("now", time.time())
    return templates.TemplateResponse(request, name, context, status_code=status_code, headers=HEADERS)


def error_page(request: Request, exc: FleetError, status_code: int) -> Response:
    """A FleetError on a page: to the login page when it needs a token, else a page saying why."""
    if isinstance(exc, Unauthorized):
        return RedirectResponse(_login_url(request), status_code=303, headers=HEADERS)
    return render(request, "error.html", status_code, error=str(exc), status=status_code)


def _login_url(request: Request) -> str:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return f"{PREFIX}/login?next={quote(here, safe='/')}"


def _safe_next(target: str) -> str:
    """Where a login may send the browser: a page of ours, never another site (``//evil``, ``\\``)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or "\\" in target or not is_page_path(parts.path):
        return PREFIX
    return target


def is_page_path(path: str) -> bool:
    return (path == PREFIX or path.startswith(PREFIX + "/")) and not path.startswith("//")


def _same_origin(request: Request) -> bool:
    """Whether a POST comes from our own pages (browsers send Origin on every form POST)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not a browser's cross-site form: nothing rides on a cookie it lacks
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def _form(request: Request) -> dict[str, str]:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX:
            return {}
    return {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()}


def page_routes(backend: Queries, tenants: TenantStore) -> APIRouter:  # noqa: C901 - one page per nested def
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    def page(
        request: Request, name: str, who: Identity, refresh_s: int = REFRESH_S, **context: Any
    ) -> HTMLResponse:
        return render(request, name, who=who, refresh_s=refresh_s, **context)

    @router.get("/login")
    def login_form(request: Request, target: Annotated[str, Query(alias="next")] = PREFIX) -> HTMLResponse:
        return render(request, "login.html", next=_safe_next(target))

    @router.post("/login")
    async def login(request: Request) -> Response:
        if not _same_origin(request):
            return render(request, "login.html", 403, next=PREFIX, error="login from another site refused")
        form = await _form(request)
        token, target = form.get("token", "").strip(), _safe_next(form.get("next", PREFIX))
        try:
            await anyio.to_thread.run_sync(identify, request, token or "-")
        except Unauthorized as exc:
            return render(request, "login.html", 401, next=target, error=str(exc))
        answer = RedirectResponse(target, status_code=303, headers=HEADERS)
        answer.set_cookie(
            COOKIE, token, path=PREFIX, httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )
        return answer

    @router.post("/logout")
    def logout(request: Request) -> Response:
        answer = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
        if _same_origin(request):
            answer.delete_cookie(
                COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=request.url.scheme == "https"
            )
        return answer

    @router.get("/refresh.js")
    def refresh_js() -> Response:
        script = resources.files("fleet.api").joinpath("templates/refresh.js").read_text()
        return Response(script, media_type="text/javascript", headers={"Cache-Control": "max-age=300"})

    @router.get("")
    def overview(request: Request, who: Reader) -> HTMLResponse:
        nodes, on_nodes = backend.nodes(), backend.on_nodes()
        tenant_of = {j.id: j.spec.tenant for j in on_nodes}

        def visible(job_id: str) -> bool:
            return sees_all(who) or tenant_of.get(job_id) == who.tenant

        # as the leader last counted them: reading the queue itself costs a read of every queued job
        scope = _scope(who)
        queued = sum(t.jobs_pending for t in tenants.status() if scope in (None, t.tenant.name))
        running = sum(visible(j.id) for j in on_nodes)
        return page(
            request,
            "overview.html",
            who,
            cards=views.node_cards(nodes, visible),
            queued=queued,
            running=running,
            quarantined=backend.quarantined_nodes(),
            mixed=backend.versions(VERSION).mixed,
            oldest=OLDEST,
            redis=redis_line(backend.redis_status(), time.time()) if who.role.allows(Role.OPERATOR) else "",
        )

    @router.get("/queue")
    def queue(request: Request, who: Reader) -> HTMLResponse:
        entries = backend.queue(_scope(who), per_tenant=QUEUE_SHOWN)
        return page(request, "queue.html", who, groups=views.by_tenant(entries), shown=QUEUE_SHOWN)

    @router.get("/running")
    def running(request: Request, who: Reader) -> HTMLResponse:
        rows = views.running_rows(backend.on_nodes(_scope(who)), backend.nodes(), time.time())
        return page(request, "running.html", who, rows=rows)

    @router.get("/tenants")
    def tenant_page(request: Request, who: Reader) -> HTMLResponse:
        total = sum(len(n.gpus) for n in backend.nodes() if n.alive)
        statuses = tenants.status()
        as_of = max((s.as_of for s in statuses), default=0.0)
        return page(
            request, "tenants.html", who, rows=views.tenant_rows(statuses, total), total=total, as_of=as_of
        )

    @router.get("/jobs/{job_id}")
    def job(request: Request, job_id: str, who: Reader) -> HTMLResponse:
        try:
            found = backend.get(job_id)
        except (JobExpired, CorruptRecord):
            raise
        except NotFound as missing:
            return array(request, job_id, who, missing)
        own_job(who, found.spec.tenant, job_id)
        position = backend.position(job_id) if found.state == JobState.QUEUED else None
        lines = backend.logs(job_id)[-LOG_TAIL:] if found.attempt else []
        wait, refresh = countdown(found, time.time()), 0 if found.state.final else REFRESH_S
        return page(
            request,
            "job.html",
            who,
            refresh,
            job=found,
            goodput=job_goodput(found),
            history=backend.history(job_id),
            lines=lines,
            position=position,
            countdown=wait,
            tail=LOG_TAIL,
        )

    def array(request: Request, array_id: str, who: Identity, missing: NotFound) -> HTMLResponse:
        try:
            found = backend.array(array_id)
        except NotFound:
            raise missing from None
        own_array(who, found.spec.tenant, array_id)
        return page(request, "array.html", who, array=found)

    return router


def _scope(who: Identity) -> str | None:
    """The tenant whose jobs ``who`` reads (None: every tenant's)."""
    return None if sees_all(who) else who.tenant
