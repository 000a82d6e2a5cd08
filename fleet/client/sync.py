"""The Python API: ``Client().submit(JobSpec(...))`` and friends, over the fleet's HTTP API.

Where the API is and who you are: ``Client(url, token)``, else ``FLEET_API_URL`` and
``FLEET_TOKEN``, else the credentials file ``fleet login`` wrote (``~/.config/fleet/credentials.json``,
mode 0600). A user never holds Redis credentials. HTTPS certificates are verified against the
system's CAs, or ``ca_file`` / ``FLEET_CA_FILE`` for a fleet's own CA.

Only the standard library talks HTTP here: the CLI starts in a fraction of what importing a Redis
or HTTP client library costs.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl  # http.client imports it anyway
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from fleet import checks
from fleet.errors import (
    ApiUnavailable,
    ConfigError,
    CorruptRecord,
    DrainTimeout,
    FleetError,
    Forbidden,
    IdInUse,
    JobExpired,
    JobTimeout,
    NotFound,
    SpecError,
    StoreUnavailable,
    TooManyRequests,
    Unauthorized,
)

# their home was here: `from fleet.client import wait` works on
from fleet.handles import ALL_COMPLETED as ALL_COMPLETED
from fleet.handles import FIRST_COMPLETED as FIRST_COMPLETED
from fleet.handles import ArrayHandle as ArrayHandle
from fleet.handles import JobHandle as JobHandle
from fleet.handles import as_completed as as_completed
from fleet.handles import wait as wait
from fleet.models import (
    FROM_FLEET,
    CancelReport,
    Event,
    FleetVersions,
    Identity,
    Job,
    JobArray,
    JobSpec,
    JobState,
    LogLine,
    Node,
    NodeState,
    QueuePosition,
    Role,
    Tenant,
    TenantStatus,
    TokenInfo,
    WebhookOutcome,
    check_job_id,
)
from fleet.versions import HEADER

#: errors the API names in its answers, raised again here as themselves (exit codes included)
_ERRORS: dict[str, type[FleetError]] = {
    cls.__name__: cls
    for cls in (
        FleetError, SpecError, IdInUse, ConfigError, NotFound, CorruptRecord, JobTimeout, StoreUnavailable,
        Unauthorized, Forbidden, TooManyRequests,
    )
}  # fmt: skip
#: what the API returns, fleet stored: an array task's spec carries the fleet.* labels a submit may not
_STORED = {FROM_FLEET: True}
#: a connection refused, closed by the server while idle, or left mid-call by an earlier error
_STALE = (
    ConnectionRefusedError, http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
    http.client.CannotSendRequest, http.client.ResponseNotReady,
)  # fmt: skip
#: a read that fails to connect is tried again this many times (an API restarting, a balancer
#: switching); a write only when the request cannot have reached the server
CONNECT_RETRIES = 3


def credentials_path() -> Path:
    """Where ``fleet login`` keeps the API's URL and the token: ``$FLEET_CREDENTIALS``, else
    ``$XDG_CONFIG_HOME/fleet/credentials.json`` (``~/.config/...``)."""
    if path := os.environ.get("FLEET_CREDENTIALS"):
        return Path(path)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "fleet" / "credentials.json"


def save_credentials(url: str, token: str, ca_file: str | None = None) -> Path:
    """Write the credentials file readable by its owner only (0600, created so: never readable
    by others even for a moment)."""
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "token": token, "ca_file": ca_file}, out)
    tmp.replace(path)
    return path


def _saved() -> dict[str, Any]:
    path = credentials_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable credentials ({exc}); run `fleet login` again") from None
    return data if isinstance(data, dict) else {}


class Client:
    """A fleet API's client. Thread-safe: each thread keeps its own connection."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, ca_file: str | None = None,
        timeout: float = 60.0,
    ) -> None:  # fmt: skip
        saved = {} if url and token else _saved()
        self.url = (url or os.environ.get("FLEET_API_URL") or saved.get("url") or "").rstrip("/")
        self._token = token or os.environ.get("FLEET_TOKEN") or saved.get("token") or ""
        if not self.url:
            raise ConfigError("no fleet API: run `fleet login URL`, or set FLEET_API_URL and FLEET_TOKEN "
                              "(`fleet up` prints them)")  # fmt: skip
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ConfigError(f"fleet API URL {self.url!r}: {exc}; expected http://HOST:PORT") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"fleet API URL {self.url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self._parts, self._timeout = parts, checks.seconds(timeout) or 60.0
        self._ca_file = ca_file or os.environ.get("FLEET_CA_FILE") or saved.get("ca_file")
        self._local = threading.local()
        #: every thread's connection, so that an AsyncClient's close reaches its pool's threads
        self._conns: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        #: the release the API named in its last answer (its ``Fleet-Version`` header, errors too);
        #: "" before any answer, or from an API that names none (0.1.0 or older)
        self.server_version = ""

    # -- HTTP --------------------------------------------------------------------------

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
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            context = ssl.create_default_context(cafile=self._ca_file)
            return http.client.HTTPSConnection(host, port, timeout=self._timeout, context=context)
        return http.client.HTTPConnection(host, port, timeout=self._timeout)

    def _send(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
              timeout: float | None = None) -> http.client.HTTPResponse:  # fmt: skip
        """The response to one call, status checked; raises the error the API named."""
        return self._exchange(method, path, body, query, timeout)[1]

    def _stream(
        self, path: str, query: dict[str, Any], timeout: float = 3600.0
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A GET whose answer is read for long (a followed log), on a connection of its own: the
        thread's connection stays free for other calls meanwhile. The caller closes both."""
        return self._exchange("GET", path, None, query, timeout, own=True)

    def _exchange(
        self, method: str, path: str, body: Any, query: dict[str, Any] | None, timeout: float | None,
        own: bool = False,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:  # fmt: skip
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
            conn.timeout = timeout or self._timeout
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

    def _call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
              timeout: float | None = None) -> Any:  # fmt: skip
        response = self._send(method, path, body, query, timeout)
        return json.loads(response.read() or b"null")

    # -- jobs --------------------------------------------------------------------------

    def submit(self, spec: JobSpec | dict[str, Any], *, job_id: str | None = None) -> JobHandle:
        """Queue a job; with ``job_id`` a repeated submit of the same spec is a no-op (idempotent).
        It runs in the token's tenant (an admin's spec may name another)."""
        if job_id is not None:
            check_job_id(job_id)
        job = _job(self._call("POST", "/v1/jobs", {"spec": self._shipped(spec), "id": job_id}))
        return JobHandle(self, job.id)

    def submit_array(
        self, spec: JobSpec | dict[str, Any], indices: str | Iterable[int], *, max_running: int | None = None,
        array_id: str | None = None,
    ) -> ArrayHandle:  # fmt: skip
        """Queue a job array in one call: task ``i`` is the job ``<array id>-<i>``, runs ``spec`` with
        ``FLEET_ARRAY_INDEX=i`` and carries the labels ``fleet.array`` and ``fleet.array.index``.

        ``indices``: ``"0-9999"``, ``"1,3,5-9"`` or integers. ``max_running``: most tasks on nodes at
        once. With ``array_id`` a repeated submit of the same array is a no-op (idempotent).
        """
        wanted = checks.indices(indices)
        body = {"spec": self._shipped(spec), "indices": wanted, "max_running": max_running, "id": array_id}
        array = _array(self._call("POST", "/v1/arrays", body))
        return ArrayHandle(self, array.id)

    def _shipped(self, spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
        """The spec as the API takes it, its ``workdir`` (a local directory) uploaded and named by
        digest: only when the fleet does not hold those bytes yet (an unchanged directory is not sent
        again)."""
        data = _spec(checks.spec(spec))
        workdir = data.get("workdir")
        if workdir and not str(workdir).startswith("sha256:"):
            data = {**data, "workdir": self.upload_workdir(str(workdir))}
        profile = data.get("profile")
        if profile and "/" in str(profile) and not str(profile).startswith("sha256:"):
            data = {**data, "profile": self.upload_profile(str(profile))}
        return data

    def upload_profile(self, path: str) -> str:
        """Read a scaling profile from a directory in the profiles format (``placements.csv``, optional
        ``scalability.csv``, ``validation-<batch>.csv`` for the batch range: see ``fleet/traces``),
        upload it unless the fleet holds it already, and return its ``sha256:<hex>`` for a spec's
        ``profile``."""
        from fleet.scheduler.profiles import load_profile, profile_data

        try:
            data = profile_data(load_profile(path))
        except FileNotFoundError as exc:
            raise SpecError(
                f"profile {path}: no {Path(exc.filename or '').name or 'such directory'} there (a "
                "directory in the profiles format: placements.csv, validation-<batch>.csv)"
            ) from None
        except (OSError, KeyError, ValueError) as exc:
            raise SpecError(f"profile {path}: not in the profiles format: {str(exc)[:200]}") from None
        return self._upload_blob(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())

    def upload_workdir(self, path: str) -> str:
        """Pack the directory (without what its .gitignore / .fleetignore name), upload it unless the
        fleet holds it already, and return its ``sha256:<hex>`` for a spec's ``workdir``."""
        from fleet.workdir import pack  # tarfile and gzip: only a submit that ships one

        return self._upload_blob(pack(path))

    def _upload_blob(self, data: bytes) -> str:
        """Upload ``data`` named by its SHA-256 unless the fleet holds it already; its ``sha256:<hex>``."""
        from fleet.workdir import digest_of

        digest = digest_of(data)
        response = self._send("HEAD", f"/v1/blobs/{digest}")
        response.read()
        if response.status == 404:
            self._call("PUT", f"/v1/blobs/{digest}", data, timeout=max(self._timeout, 600.0))
        return digest

    def get(self, job_id: str) -> Job:
        return _job(self._call("GET", f"/v1/jobs/{_segment(checks.ident(job_id))}"))

    def array(self, array_id: str) -> JobArray:
        """A job array with its tasks counted by state."""
        return _array(self._call("GET", f"/v1/arrays/{_segment(checks.ident(array_id, 'array id'))}"))

    def listing(
        self, state: JobState | str | None = None, limit: int = 100, tenant: str | None = None,
        user: str | None = None, labels: dict[str, str] | None = None,
    ) -> list[Job | JobArray]:  # fmt: skip
        """Jobs newest first, each job array as one entry with its tasks counted by state (what
        ``fleet jobs`` shows); with ``state``, the jobs in it and the arrays with a task in it. A
        user's token sees its tenant's; an operator's every tenant's (or ``tenant``'s). ``user`` and
        ``labels`` keep the jobs that user submitted, or that carry all those labels."""
        rows = self._call("GET", "/v1/jobs", query=_filters(state, limit, tenant, user, labels))
        return [_array(r) if r.get("kind") == "array" else _job(r) for r in rows]

    def job(self, job_id: str) -> JobHandle:
        """A handle on a job submitted earlier (:class:`NotFound` if there is none)."""
        self.get(job_id)
        return JobHandle(self, job_id)

    def jobs(
        self, state: JobState | str | None = None, limit: int = 1000, tenant: str | None = None,
        user: str | None = None, labels: dict[str, str] | None = None,
    ) -> list[Job]:  # fmt: skip
        """Every job (array tasks one by one), newest first; filtered as :meth:`listing`."""
        query = _filters(state, limit, tenant, user, labels) | {"flat": "true"}
        return [_job(r) for r in self._call("GET", "/v1/jobs", query=query)]

    def quarantined_jobs(self) -> dict[str, str]:
        """Jobs whose stored record cannot be read (id -> why), set aside by the controller
        (operators see them; a user's token gets none: an unreadable record names no tenant)."""
        return dict(self._call("GET", "/v1/quarantine")["jobs"])

    def position(self, job_id: str) -> QueuePosition | None:
        """Where a QUEUED job stands in its tenant's queue and in the whole queue (None otherwise)."""
        found = self._call("GET", f"/v1/jobs/{_segment(checks.ident(job_id))}/position")
        return None if found is None else QueuePosition.model_validate(found)

    def history(self, job_id: str) -> list[Event]:
        path = f"/v1/jobs/{_segment(checks.ident(job_id))}/history"
        return [Event.model_validate(e) for e in self._call("GET", path)]

    def cancel(self, job_id: str) -> Job:
        """Cancel: a queued job at once; a running one is stopped by its agent, then CANCELLED."""
        return _job(self._call("POST", f"/v1/jobs/{_segment(checks.ident(job_id))}/cancel"))

    def resize(self, job_id: str, gpus: int, batch_size: int | None = None) -> Job:
        """Resize an elastic job within its range (``batch_size`` default: scaled with the GPUs). A running
        job checkpoints on SIGTERM and starts again at the new size, spending no retry."""
        body = {"gpus": gpus, "batch_size": batch_size}
        return _job(self._call("POST", f"/v1/jobs/{_segment(job_id)}/resize", body))

    def cancel_array(self, array_id: str) -> CancelReport:
        """Cancel every task of a job array: queued ones at once, in one atomic step per 10,000."""
        path = f"/v1/arrays/{_segment(checks.ident(array_id, 'array id'))}/cancel"
        return CancelReport.model_validate(self._call("POST", path))

    def cancel_labels(self, labels: dict[str, str]) -> CancelReport:
        """Cancel every job not yet final that carries all of ``labels`` (``{"fleet.array": ID}``
        names an array's tasks), within the token's tenant."""
        if not checks.labels(labels):
            raise SpecError("cancel by label: give at least one label KEY=VALUE")
        return CancelReport.model_validate(self._call("POST", "/v1/cancel", {"labels": labels}))

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is final; raise :class:`JobTimeout` after ``timeout`` seconds."""
        timeout = checks.seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        path = f"/v1/jobs/{_segment(checks.ident(job_id))}/wait"
        while True:
            left = 30.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job = _job(self._call("GET", path, query={"timeout_s": f"{left:.3f}"},
                                      timeout=left + self._timeout))  # fmt: skip
            except TooManyRequests:  # this token holds its most blocking calls: look, and look again
                job = self.get(job_id)
                if not job.state.final:
                    time.sleep(min(1.0, left))
            if job.state.final:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job {job_id} still {job.state} after {timeout:g}s")

    def logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> list[LogLine]:
        """Log lines of ``attempt`` (default: the latest); of member ``rank`` of a multi-node job."""
        query = {"attempt": checks.attempt(attempt), "rank": checks.count(rank, "rank", 0, 64)}
        rows = self._call("GET", f"/v1/jobs/{_segment(checks.ident(job_id))}/logs", query=query)
        return [LogLine.model_validate(r) for r in rows]

    def follow_logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> Iterator[LogLine]:
        """Yield log lines as they arrive until the attempt is over and its stream drained."""
        conn, response = self._stream(*_follow(job_id, attempt, rank))
        try:
            while line := response.readline():
                yield LogLine.model_validate_json(line)
        finally:
            response.close()
            conn.close()

    # -- nodes -------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return [Node.model_validate(n) for n in self._call("GET", "/v1/nodes")]

    def most_gpus(self) -> int:
        """The most GPUs one live node has: a job asking for more stays QUEUED until such a node joins."""
        return int(self._call("GET", "/v1/fleet")["most_gpus"])

    def quarantined_nodes(self) -> dict[str, str]:
        """Nodes whose stored record cannot be read (name -> why); they get no jobs until it reads."""
        return dict(self._call("GET", "/v1/quarantine")["nodes"])

    def versions(self) -> FleetVersions:
        """Which release the API, the leading controller and each live node's agent run ("" for one
        that recorded none: 0.1.0 or older), and ``mixed`` when they differ. An API of 0.1.0 has no
        such route: :class:`NotFound` (and ``server_version`` is "")."""
        return FleetVersions.model_validate(self._call("GET", "/v1/version"))

    def node(self, name: str) -> Node:
        return Node.model_validate(self._call("GET", f"/v1/nodes/{_segment(checks.ident(name, 'node'))}"))

    def cordon(self, name: str, reason: str = "") -> Node:
        """No new jobs on ``name``; running ones are untouched. Idempotent. Operators only."""
        return Node.model_validate(
            self._call("POST", f"/v1/nodes/{_segment(checks.ident(name, 'node'))}/cordon", {"reason": reason})
        )

    def uncordon(self, name: str) -> Node:
        """Back to READY (also ends a drain). Operators only."""
        return Node.model_validate(
            self._call("POST", f"/v1/nodes/{_segment(checks.ident(name, 'node'))}/uncordon")
        )

    def drain(
        self, names: str | Sequence[str], *, deadline_s: float = 3600.0, grace_s: float = 60.0,
        force: bool = False, reason: str = "",
    ) -> list[Node]:  # fmt: skip
        """Cordon every node first (so work does not hop onto the next one), then drain them.

        Running jobs may finish until the deadline (``force``: now); then each gets SIGTERM and
        ``grace_s`` to checkpoint, and is requeued elsewhere without spending its retries.
        """
        body = {
            "names": checks.names(names), "deadline_s": checks.seconds(deadline_s, "deadline_s"),
            "grace_s": checks.seconds(grace_s, "grace_s"), "force": bool(force), "reason": reason,
        }  # fmt: skip
        return [Node.model_validate(n) for n in self._call("POST", "/v1/drain", body)]

    def wait_drained(
        self,
        names: str | Sequence[str],
        timeout: float | None = None,
        progress: Callable[[list[Node]], None] | None = None,
    ) -> list[Node]:
        """Block until every node is DRAINED; raise :class:`DrainTimeout` after ``timeout`` seconds."""
        names, timeout = checks.names(names), checks.seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            nodes = [self.node(name) for name in names]
            if all(n.admin_state == NodeState.DRAINED for n in nodes):
                return nodes
            if progress is not None:
                progress(nodes)
            if deadline is not None and time.monotonic() >= deadline:
                left = sum(len(n.jobs) for n in nodes)
                raise DrainTimeout(f"not drained after {timeout:g}s: {left} jobs left")
            time.sleep(0.5)

    # -- tenants -----------------------------------------------------------------------

    def tenants(self) -> list[TenantStatus]:
        """Every tenant's policy, GPUs in use, fair share and decayed usage (as the leader last
        published them: ``as_of``)."""
        return [TenantStatus.model_validate(t) for t in self._call("GET", "/v1/tenants")]

    def set_tenant(self, name: str, **policy: Any) -> Tenant:
        """Create or replace a tenant's policy (``guaranteed_gpus``, ``max_gpus``, ``weight``,
        ``preempt_grace_s``, ``min_run_s``, ``allowed_users``; those left out get their defaults).
        Admins only."""
        path = f"/v1/tenants/{_segment(checks.ident(name, 'tenant'))}"
        return Tenant.model_validate(
            self._call(
                "PUT",
                path,
                Tenant(name=name, **policy).model_dump(mode="json", exclude_unset=True, exclude={"name"}),
            )
        )

    def delete_tenant(self, name: str) -> Tenant:
        """Forget a tenant's policy: its jobs get the default one. Admins only."""
        return Tenant.model_validate(
            self._call("DELETE", f"/v1/tenants/{_segment(checks.ident(name, 'tenant'))}")
        )

    # -- webhooks ----------------------------------------------------------------------

    def webhook_secret(self, tenant: str | None = None) -> str:
        """The secret the tenant's webhook deliveries are signed with (``X-Fleet-Signature-256``;
        check it with :func:`fleet.webhooks.verify`): the token's tenant's, or an admin's any."""
        query = {"tenant": None if tenant is None else checks.ident(tenant, "tenant")}
        return str(self._call("GET", "/v1/webhooks/secret", query=query)["secret"])

    def rotate_webhook_secret(self, tenant: str | None = None) -> str:
        """A new signing secret for the tenant, used from now on. Admins only."""
        query = {"tenant": None if tenant is None else checks.ident(tenant, "tenant")}
        return str(self._call("POST", "/v1/webhooks/secret/rotate", query=query)["secret"])

    def webhook_deliveries(self, tenant: str | None = None, limit: int = 100) -> list[WebhookOutcome]:
        """How the newest delivery attempts went, newest first (failures say why, and retries when
        the next attempt is due): the token's tenant's; an operator's every tenant's or ``tenant``'s."""
        query = {"tenant": None if tenant is None else checks.ident(tenant, "tenant"),
                 "limit": checks.count(limit, "limit", 1, 1000)}  # fmt: skip
        return [
            WebhookOutcome.model_validate(o)
            for o in self._call("GET", "/v1/webhooks/deliveries", query=query)
        ]

    # -- identities --------------------------------------------------------------------

    def whoami(self) -> Identity:
        return Identity.model_validate(self._call("GET", "/v1/whoami"))

    def create_token(
        self, user: str, tenant: str, role: Role | str = Role.USER, expires_in_s: float | None = None
    ) -> tuple[str, TokenInfo]:
        """A new token (shown only now) and its record. Admins only."""
        if str(role) not in {r.value for r in Role}:
            raise SpecError(f"role {role!r}: expected one of {', '.join(r.value for r in Role)}")
        body = {
            "user": checks.ident(user, "user"), "tenant": checks.ident(tenant, "tenant"), "role": str(role),
            "expires_in_s": checks.seconds(expires_in_s, "expires_in_s"),
        }  # fmt: skip
        issued = self._call("POST", "/v1/tokens", body)
        return issued["token"], TokenInfo.model_validate(issued["info"])

    def tokens(self) -> list[TokenInfo]:
        return [TokenInfo.model_validate(t) for t in self._call("GET", "/v1/tokens")]

    def revoke_token(self, token_id: str) -> TokenInfo:
        return TokenInfo.model_validate(
            self._call("DELETE", f"/v1/tokens/{_segment(checks.ident(token_id, 'token id'))}")
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close this thread's connection (the next call opens another)."""
        self._drop()

    def _close_all(self) -> None:
        """Close every thread's connection (the client's threads are done with it)."""
        for conn in list(self._conns):
            conn.close()

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _job(data: Any) -> Job:
    return Job.model_validate(data, context=_STORED)


def _array(data: Any) -> JobArray:
    return JobArray.model_validate(data, context=_STORED)


def _spec(spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
    """A spec as the API takes it: fields the caller set (so the tenant defaults to the token's)."""
    if isinstance(spec, JobSpec):
        return spec.model_dump(mode="json", exclude_unset=True)
    return spec


def _state(state: JobState | str | None) -> str | None:
    parsed = JobState.parse(state)
    return None if parsed is None else str(parsed)


def _filters(
    state: JobState | str | None,
    limit: int,
    tenant: str | None,
    user: str | None,
    labels: dict[str, str] | None,
) -> dict[str, Any]:
    labels = checks.labels(labels)
    pairs = None if not labels else [f"{k}={v}" for k, v in labels.items()]
    for what, value in (("tenant", tenant), ("user", user)):
        if value is not None:
            checks.ident(value, what)
    limit = checks.count(limit, "limit")
    return {"state": _state(state), "limit": limit, "tenant": tenant, "user": user, "label": pairs}


def _follow(job_id: str, attempt: int | None, rank: int) -> tuple[str, dict[str, Any]]:
    """Path and query of a followed log, arguments checked."""
    query = {"attempt": checks.attempt(attempt), "rank": checks.count(rank, "rank", 0, 64), "follow": "true"}
    return f"/v1/jobs/{_segment(checks.ident(job_id))}/logs", query


def _segment(value: str) -> str:
    """An id as one path segment: anything that is not a plain name cannot name a job or node."""
    from urllib.parse import quote

    return quote(str(value), safe="")


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
    if name == "ApiUnavailable" or response.status == 503:
        return ApiUnavailable(detail)
    return _ERRORS.get(name, FleetError)(detail)
