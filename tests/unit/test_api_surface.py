"""The API's surface is declared once a side and held together here: every request the Python
clients can send (the endpoint table, :mod:`fleet.client.endpoints` and
:mod:`fleet.client.fleet_endpoints`, plus the blob and stream paths the clients send themselves) is
a route the API serves with that method, every route the API publishes is one the clients can call,
and :class:`fleet.AsyncClient` and its handles offer what the sync ones do, with the same arguments.
The CLI goes through :class:`fleet.Client` (nothing under ``fleet/cli`` names an API path), so it
is held by the same checks."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import fleet
from fleet.api.app import create_app
from fleet.client import aio, handles, sync
from fleet.config import Settings

CLIENT = Path(fleet.__file__).parent / "client"
VERBS = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"}
#: a path built at run time with a segment left to the caller, as its template (``{}``)
ANY = "{}"
#: Methods of the async API that make no call (so need not be coroutines), and why.
LOCAL = {"task": "an array task's handle, made from the array's id without asking the API"}
#: Methods whose async arguments differ from the sync ones, and why.
SPELLED_OTHERWISE = {
    "logs": "the sync logs(follow=True) returns an iterator; the async one is follow_logs(), an async "
    "iterator, since an awaited call cannot hand one back in a single expression"
}


def _template(node: ast.expr) -> str | None:
    """The API path a string or f-string spells, each interpolated part as ``{}``; None if it is
    not an API path."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(str(v.value) if isinstance(v, ast.Constant) else ANY for v in node.values)
    else:
        return None
    return text if text.startswith("/v1/") else None


def client_requests() -> set[tuple[str | None, str]]:
    """(method, path template) of every API path written in the client's modules; the method is
    the verb the same function names, None where it names none (a path handed to a stream, or to
    a call made elsewhere)."""
    found: set[tuple[str | None, str]] = set()
    for module in sorted(CLIENT.glob("*.py")):
        tree = ast.parse(module.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            parts = {id(v) for n in ast.walk(func) if isinstance(n, ast.JoinedStr) for v in n.values}
            paths = {
                t
                for n in ast.walk(func)
                if isinstance(n, ast.expr) and id(n) not in parts and (t := _template(n))
            }
            verbs = {n.value for n in ast.walk(func) if isinstance(n, ast.Constant) and n.value in VERBS}
            if len(verbs) > 1 and len(paths) > 1:
                pytest.fail(f"{module.name}:{func.name}: several verbs and paths in one function")
            found |= {(v, p) for p in paths for v in (verbs or {None})}
    return found


def served_routes() -> set[tuple[str, str]]:
    """(method, path) of every API route the published schema lists."""
    schema = create_app(Settings()).openapi()
    return {
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        for method in operations
        if path.startswith("/v1/")
    }


def _matches(template: str, path: str) -> bool:
    """Whether a client's path template names a route's path: segment by segment the same, a
    ``{}`` of the client (a value it interpolates) standing for a route's ``{param}`` or for one of
    its fixed segments (``/v1/arrays/{}/{act}`` is both hold and release)."""
    ours, theirs = template.split("/"), path.split("/")
    return len(ours) == len(theirs) and all(a in (ANY, b) for a, b in zip(ours, theirs, strict=True))


def test_the_client_side_finds_the_calls_it_makes() -> None:
    # the extractor itself: a few requests known to be sent, in each form they are written
    requests = client_requests()
    assert ("POST", "/v1/jobs/batch") in requests  # a constant path
    assert ("POST", "/v1/nodes/{}/cordon") in requests  # an f-string
    assert ("POST", "/v1/arrays/{}/{}") in requests  # hold or release, by argument
    assert (None, "/v1/blobs/{}") in requests  # a path the client sends itself (HEAD, PUT)
    assert len(requests) >= 40


def _names(request: tuple[str | None, str], route: tuple[str, str]) -> bool:
    """Whether a client's (method or None, path template) is a request for a route (method, path)."""
    (verb, template), (method, path) = request, route
    return verb in (None, method) and _matches(template, path)


def test_every_request_a_client_sends_is_a_route_the_api_serves() -> None:
    routes = served_routes()
    unknown = sorted(
        f"{r[0] or 'any'} {r[1]}" for r in client_requests() if not any(_names(r, route) for route in routes)
    )
    assert unknown == []


def test_every_route_the_api_serves_is_one_a_client_calls() -> None:
    requests = client_requests()
    uncalled = sorted(
        f"{route[0]} {route[1]}" for route in served_routes() if not any(_names(r, route) for r in requests)
    )
    assert uncalled == []


def test_the_matcher_tells_a_path_from_another() -> None:
    assert _matches("/v1/jobs/{}/cancel", "/v1/jobs/{job_id}/cancel")
    assert not _matches("/v1/jobs/{}/cancel", "/v1/jobs/{job_id}/cancell")
    assert not _matches("/v1/jobs/{}", "/v1/jobs/{job_id}/cancel")
    assert not _matches("/v1/jobs/cancel", "/v1/arrays/{array_id}")
    assert not _matches("/v1/jobs/batch", "/v1/jobs/{job_id}")  # a fixed segment is not a value


def _signature(func: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("blocking", "awaited"),
    [
        (sync.Client, aio.AsyncClient),
        (handles.JobHandle, aio.AsyncJobHandle),
        (handles.ArrayHandle, aio.AsyncArrayHandle),
    ],
    ids=["client", "job-handle", "array-handle"],
)
def test_the_async_api_offers_what_the_sync_one_does_with_the_same_arguments(
    blocking: type, awaited: type
) -> None:
    public = sorted(n for n in dir(blocking) if not n.startswith("_"))
    missing = [n for n in public if not hasattr(awaited, n)]
    assert missing == []
    differ = []
    for name in public:
        ours, theirs = getattr(blocking, name), getattr(awaited, name)
        if isinstance(ours, property) or not callable(ours):
            assert isinstance(theirs, property) or not callable(theirs), name
            continue
        if name not in SPELLED_OTHERWISE and _signature(ours) != _signature(theirs):
            differ.append(name)
        if name not in LOCAL and not (
            inspect.iscoroutinefunction(theirs) or inspect.isasyncgenfunction(theirs)
        ):
            differ.append(f"{name} (not a coroutine)")
    assert differ == []
