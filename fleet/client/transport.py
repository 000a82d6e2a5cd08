"""HTTP to the fleet API over kept-alive connections, with the standard library alone (the CLI starts
in a fraction of what importing an HTTP client library costs).

One connection per thread, opened on the first call and reused by every later one: a loop of
calls pays for one TCP (and TLS) handshake, not one a call. A connection the server closed while
idle is replaced without the caller noticing; a call that cannot have reached the server is tried
again on a fresh one. :class:`fleet.AsyncClient` runs calls on a pool of threads, so its pool is
``max_threads`` such connections. An answer naming a fleet error raises that error here.
"""

from __future__ import annotations

import http.client
import json
import ssl  # http.client imports it anyway
import threading
import time
import weakref
from typing import Any, TypeVar
from urllib.parse import urlencode

from fleet.client.calls import Call
from fleet.client.credentials import Credentials
from fleet.errors import (
    ApiUnavailable,
    ConfigError,
    CorruptRecord,
    FleetError,
    Forbidden,
    IdInUse,
    JobExpired,
    JobTimeout,
    NotFound,
    NotReplicated,
    SpecError,
    StoreUnavailable,
    TooManyRequests,
    Unauthorized,
)
from fleet.versions import HEADER

R = TypeVar("R")
#: errors the API names in its answers, raised again here as themselves (exit codes included)
_ERRORS: dict[str, type[FleetError]] = {
    cls.__name__: cls
    for cls in (
        FleetError,
        SpecError,
        IdInUse,
        ConfigError,
        NotFound,
        CorruptRecord,
        JobTimeout,
        StoreUnavailable,
        NotReplicated,
        Unauthorized,
        Forbidden,
        TooManyRequests,
    )
}
#: a connection refused, closed by the server while idle, or left mid-call by an earlier error
_STALE = (
    ConnectionRefusedError,
    http.client.RemoteDisconnected,
    BrokenPipeError,
    ConnectionResetError,
    http.client.CannotSendRequest,
    http.client.ResponseNotReady,
)
#: a read that fails to connect is tried again this many times (an API restarting, a balancer
#: switching); a write only when the request cannot have reached the server
CONNECT_RETRIES = 3


class Transport:
    """Calls to one API with one token. Thread-safe: each thread keeps its own connection."""

    def __init__(self, credentials: Credentials, timeout: float) -> None:
        self.url, self.timeout = credentials.url, timeout
        self._parts, self._token, self._ca_file = credentials.parts, credentials.token, credentials.ca_file
        self._local = threading.local()
        #: every thread's connection, so that an AsyncClient's close reaches its pool's threads
        self._conns: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._lock = threading.Lock()
        #: connections opened so far (kept alive, one serves every call of its thread)
        self.opened = 0
        #: the release the API named in its last answer (its ``Fleet-Version`` header, errors too);
        #: "" before any answer, or from an API that names none (0.1.0 or older)
        self.server_version = ""

    def call(self, call: Call[R]) -> R:
        """Send ``call``, and its answer parsed as the endpoint declares."""
        response = self.send(call.method, call.path, call.body, call.query, call.timeout)
        return call.parse(json.loads(response.read() or b"null"))

    def send(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> http.client.HTTPResponse:
        """The response to one call, status checked; raises the error the API named."""
        return self._exchange(method, path, body, query, timeout)[1]

    def stream(
        self, path: str, query: dict[str, Any], timeout: float = 3600.0
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A GET whose answer is read for long (a followed log), on a connection of its own: the
        thread's connection stays free for other calls meanwhile. The caller closes both."""
        return self._exchange("GET", path, None, query, timeout, own=True)

    def close(self) -> None:
        """Close this thread's connection (the next call opens another)."""
        self._drop()

    def close_all(self) -> None:
        """Close every thread's connection (the client's threads are done with it)."""
        for conn in list(self._conns):
            conn.close()

    # -- connections -------------------------------------------------------------------

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        """This thread's connection (kept alive between calls)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and not fresh:
            return conn
        if conn is not None:
            conn.close()
        self._local.conn = conn = self._open()
        self._conns.add(conn)
        return conn

    def _open(self) -> http.client.HTTPConnection:
        with self._lock:
            self.opened += 1
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            context = ssl.create_default_context(cafile=self._ca_file)
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _exchange(
        self,
        method: str,
        path: str,
        body: Any,
        query: dict[str, Any] | None,
        timeout: float | None,
        own: bool = False,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        params = {k: v for k, v in (query or {}).items() if v is not None}
        target = self._parts.path + path + (f"?{urlencode(params, doseq=True)}" if params else "")
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if isinstance(body, bytes):
            data: bytes | None = body
            headers["Content-Type"] = "application/octet-stream"
        else:
            data = None if body is None else json.dumps(body).encode()
            if data is not None:
                headers["Content-Type"] = "application/json"
        for attempt in range(CONNECT_RETRIES + 1):
            conn = self._open() if own else self._connection(fresh=attempt > 0)
            drop = conn.close if own else self._drop
            conn.timeout = timeout or self.timeout
            try:
                conn.request(method, target, data, headers)
                response = conn.getresponse()
                break
            except _STALE as exc:
                # a connection the server closed while idle, or left mid-call by an earlier error:
                # never reused; the call is tried again on a fresh one
                drop()
                sent = not isinstance(exc, ConnectionRefusedError)
                if attempt == CONNECT_RETRIES or (sent and method != "GET" and attempt > 0):
                    raise ApiUnavailable(f"fleet API at {self.url} unreachable: {exc}") from None
                time.sleep(0.2 * attempt)
            except ssl.SSLCertVerificationError as exc:
                drop()
                raise ConfigError(
                    f"fleet API at {self.url}: its certificate cannot be verified ({exc.verify_message}); "
                    "give the CA that signed it with --ca-file (fleet login) or FLEET_CA_FILE"
                ) from None
            except OSError as exc:
                drop()
                raise ApiUnavailable(f"fleet API at {self.url} unreachable: {exc}") from None
        self.server_version = response.getheader(HEADER) or ""
        if response.status >= 400 and not (method == "HEAD" and response.status == 404):
            error = _error(response, self.url)
            if own:
                conn.close()
            raise error
        return conn, response


def _error(response: http.client.HTTPResponse, url: str) -> FleetError:
    """The error an API answer names, as its fleet type; a proxy's or a stranger's page as what it is."""
    raw = response.read()
    try:
        body = json.loads(raw)
        name, detail = body["error"], body["detail"]
    except (ValueError, KeyError, TypeError):
        text = raw[:200].decode(errors="replace").strip()
        if response.status in (502, 503, 504):
            return ApiUnavailable(f"fleet API at {url}: HTTP {response.status} {text}")
        if response.status == 404:  # no such route: a wrong URL, or an API older than the route
            return NotFound(f"fleet API at {url}: HTTP 404 {text}")
        return FleetError(f"fleet API at {url}: HTTP {response.status} {text}")
    if name == "JobExpired" and isinstance(body.get("expired"), dict):
        return JobExpired(**body["expired"])
    if name == "NotReplicated":  # a 503 whose write reached Redis: retry it (the same job id)
        return NotReplicated(detail)
    if name == "ApiUnavailable" or response.status == 503:
        return ApiUnavailable(detail)
    return error_named(name, detail)


def error_named(name: str, detail: str) -> FleetError:
    """The fleet error an API answer names (its ``error``), as its type."""
    return _ERRORS.get(name, FleetError)(detail)
