"""The Python API: ``Client().submit(JobSpec(...))`` and friends, over the fleet's HTTP API.

Each method is one call of :mod:`fleet.client.endpoints` (or a few: a submit that ships a directory,
a wait longer than the API's 30 s) sent by :mod:`fleet.client.transport` on a kept-alive connection.
Where the API is and who you are: :mod:`fleet.client.credentials`.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.client import calls, checks
from fleet.client import endpoints as api
from fleet.client import fleet_endpoints as fleet_api
from fleet.client.calls import Call
from fleet.client.credentials import resolve
from fleet.client.download import unpack
from fleet.client.handles import ArrayHandle, JobHandle
from fleet.client.transport import Transport
from fleet.errors import DrainTimeout, JobTimeout, SpecError, TooManyRequests, at_index
from fleet.models import (
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
    RedisStatus,
    RequeueReport,
    Role,
    TasksChanged,
    Tenant,
    TenantStatus,
    TokenInfo,
    WebhookOutcome,
    check_job_id,
)
from fleet.models.usage import History

if TYPE_CHECKING:
    from fleet.client.workdir import Progress, Shipped

R = TypeVar("R")


class Client:
    """A fleet API's client. Thread-safe: each thread keeps its own connection, kept alive."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ca_file: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        credentials = resolve(url, token, ca_file)
        self.url = credentials.url
        self._timeout = checks.seconds(timeout) or 60.0
        self.transport = Transport(credentials, self._timeout)

    @property
    def server_version(self) -> str:
        """The release the API named in its last answer (``Fleet-Version``); "" before any answer, or
        from an API that names none (0.1.0 or older)."""
        return self.transport.server_version

    def _do(self, call: Call[R]) -> R:
        return self.transport.call(call)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """A call no endpoint declares (tests probe the API with it); its JSON answer."""
        return self._do(Call(method, path, lambda data: data, body, query, timeout))

    # -- jobs --------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec | dict[str, Any],
        *,
        job_id: str | None = None,
        after: Iterable[object] | None = None,
    ) -> JobHandle:
        """Queue a job; with ``job_id`` a repeated submit of the same spec is a no-op (idempotent).
        It runs in the token's tenant (an admin's spec may name another). ``after``: jobs it waits
        for (handles or ids, ``"JOB:any"``), added to the spec's ``after``."""
        if job_id is not None:
            check_job_id(job_id)  # before a shipped directory is uploaded
        deps = checks.after(after)
        body = calls.waiting(self._shipped(spec), deps)
        return JobHandle(self, self._do(api.submit(body, job_id)).id)

    def submit_many(
        self,
        specs: Iterable[JobSpec | dict[str, Any]],
        *,
        job_ids: Sequence[str | None] | None = None,
        after: Iterable[object] | None = None,
    ) -> list[JobHandle]:
        """Queue up to 1,000 jobs in one call, all or nothing: every spec is checked before any job is
        queued, and a refusal names the first bad one (``jobs[3]: gpus: ...``). Handles in order.
        ``job_ids[i]``, when given, makes job ``i`` idempotent as :meth:`submit`'s ``job_id`` does, so a
        batch whose call failed midway can be sent again as it was. ``after``: jobs every one of them
        waits for (as :meth:`submit`'s), added to each spec's ``after``."""
        specs = list(specs)
        job_ids = api.check_batch(len(specs), job_ids)  # before any directory is uploaded
        deps = checks.after(after)
        shipped: dict[str, dict[str, Any]] = {}  # one upload per distinct directory, not per spec
        bodies = [calls.waiting(at_index(i, self._shipped, s, shipped), deps) for i, s in enumerate(specs)]
        return [JobHandle(self, job_id) for job_id in self._do(api.submit_batch(bodies, job_ids))]

    def submit_array(
        self,
        spec: JobSpec | dict[str, Any],
        indices: str | Iterable[int],
        *,
        max_running: int | None = None,
        array_id: str | None = None,
    ) -> ArrayHandle:
        """Queue a job array in one call: task ``i`` is the job ``<array id>-<i>``, runs ``spec`` with
        ``FLEET_ARRAY_INDEX=i`` and carries the labels ``fleet.array`` and ``fleet.array.index``.

        ``indices``: ``"0-9999"``, ``"1,3,5-9"`` or integers. ``max_running``: most tasks on nodes at
        once. With ``array_id`` a repeated submit of the same array is a no-op (idempotent).
        """
        wanted = checks.indices(indices)  # before a shipped directory is uploaded
        call = api.submit_array(self._shipped(spec), wanted, max_running, array_id)
        return ArrayHandle(self, self._do(call).id)

    def _shipped(
        self, spec: JobSpec | dict[str, Any], uploaded: dict[str, dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The spec as the API takes it, its ``workdir`` (a local directory) uploaded and named by
        digest: only when the fleet does not hold those bytes yet (an unchanged directory is not sent
        again). ``uploaded``: what this call uploaded already, by field and path."""
        data = calls.spec_body(checks.spec(spec))
        done = {} if uploaded is None else uploaded
        for field, upload in (("workdir", self.upload_workdir), ("profile", self.upload_profile)):
            value = str(data.get(field) or "")
            if not value or value.startswith("sha256:") or (field == "profile" and "/" not in value):
                continue
            digests = done.setdefault(field, {})
            if value not in digests:
                digests[value] = upload(value)
            data = {**data, field: digests[value]}
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
        return self.upload_blob(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())

    def upload_workdir(self, path: str) -> str:
        """Pack the directory (without what its .gitignore / .fleetignore name), upload it unless the
        fleet holds it already, and return its ``sha256:<hex>`` for a spec's ``workdir``. A directory
        unchanged since it was last packed here is not packed again (``fleet.client.workdir``)."""
        return self.ship_workdir(path).digest

    def ship_workdir(self, path: str, progress: Progress | None = None) -> Shipped:
        """:meth:`upload_workdir`, saying what it did (files, sizes, whether it uploaded);
        ``progress(step, done, total)`` is told how packing and uploading go."""
        from fleet.client.workdir import ship  # tarfile and gzip: only a submit that ships one

        return ship(path, self._holds, self._put_blob, progress=progress)

    def upload_blob(self, data: bytes) -> str:
        """Upload ``data`` named by its SHA-256 unless the fleet holds it already; its ``sha256:<hex>``
        (a function's call: :mod:`fleet.client.functions`)."""
        from fleet.workdir import digest_of

        digest = digest_of(data)
        if not self._holds(digest):
            self._put_blob(digest, data)
        return digest

    def _holds(self, digest: str) -> bool:
        response = self.transport.send("HEAD", api.blob_path(digest))
        response.read()
        return response.status != 404

    def _put_blob(self, digest: str, data: bytes) -> None:
        self._call("PUT", api.blob_path(digest), data, timeout=max(self._timeout, 600.0))

    def get(self, job_id: str) -> Job:
        return self._do(api.get(job_id))

    def array(self, array_id: str) -> JobArray:
        """A job array with its tasks counted by state."""
        return self._do(api.get_array(array_id))

    def listing(
        self,
        state: JobState | str | None = None,
        limit: int = 100,
        tenant: str | None = None,
        user: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[Job | JobArray]:
        """Jobs newest first, each job array as one entry with its tasks counted by state (what
        ``fleet jobs`` shows); with ``state``, the jobs in it and the arrays with a task in it. A
        user's token sees its tenant's; an operator's every tenant's (or ``tenant``'s). ``user`` and
        ``labels`` keep the jobs that user submitted, or that carry all those labels."""
        return self._do(api.listing(api.filters(state, limit, tenant, user, labels)))

    def job(self, job_id: str) -> JobHandle:
        """A handle on a job submitted earlier (:class:`NotFound` if there is none)."""
        self.get(job_id)
        return JobHandle(self, job_id)

    def jobs(
        self,
        state: JobState | str | None = None,
        limit: int = 1000,
        tenant: str | None = None,
        user: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[Job]:
        """Every job (array tasks one by one), newest first; filtered as :meth:`listing`."""
        return self._do(api.jobs(api.filters(state, limit, tenant, user, labels)))

    def quarantined_jobs(self) -> dict[str, str]:
        """Jobs whose stored record cannot be read (id -> why), set aside by the controller
        (operators see them; a user's token gets none: an unreadable record names no tenant)."""
        return self._do(api.quarantined("jobs"))

    def position(self, job_id: str) -> QueuePosition | None:
        """Where a QUEUED job stands in its tenant's queue and in the whole queue (None otherwise)."""
        return self._do(api.position(job_id))

    def history(self, job_id: str) -> list[Event]:
        return self._do(api.history(job_id))

    def usage(
        self,
        since: float | str = "30d",
        until: float | str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        by: str = "user",
        limit: int = 1000,
    ) -> History:
        """Accounting (``fleet history``): what jobs that ended in [since, until) used, per tenant,
        user or job (``by``), kept after the jobs expired. Times: Unix seconds, a span back (``30d``,
        ``2w``) or an ISO date; ``until`` default now. A user's token reads its own tenant's."""
        return self._do(api.usage(since, until, tenant, user, by, limit))

    def cancel(self, job_id: str) -> Job:
        """Cancel: a queued job at once; a running one is stopped by its agent, then CANCELLED."""
        return self._do(api.cancel(job_id))

    def send_stdin(self, job_id: str, data: bytes, eof: bool = False) -> int:
        """Bytes for the stdin of a job submitted with ``stdin`` (``eof``: its input ends after them);
        the bytes it was sent so far (-1 once ended). Only its submitter may, until it is final."""
        return self._do(api.send_stdin(job_id, data, eof))

    def resize(self, job_id: str, gpus: int, batch_size: int | None = None) -> Job:
        """Resize an elastic job within its range (``batch_size`` default: scaled with the GPUs). A running
        job checkpoints on SIGTERM and starts again at the new size, spending no retry."""
        return self._do(api.resize(job_id, gpus, batch_size))

    def cancel_array(self, array_id: str) -> CancelReport:
        """Cancel every task of a job array: queued ones at once, in one atomic step per 10,000."""
        return self._do(api.cancel_array(array_id))

    def cancel_labels(self, labels: dict[str, str]) -> CancelReport:
        """Cancel every job not yet final that carries all of ``labels`` (``{"fleet.array": ID}``
        names an array's tasks), within the token's tenant."""
        return self._do(api.cancel_labels(labels))

    def hold(self, job_id: str) -> Job:
        """Keep a queued job from being placed until :meth:`release` (it stays QUEUED, "held by ...")."""
        return self._do(api.hold(job_id))

    def release(self, job_id: str) -> Job:
        """Let a held job be placed again."""
        return self._do(api.release(job_id))

    def hold_array(self, array_id: str) -> TasksChanged:
        """:meth:`hold` every queued task of a job array; how many it held."""
        return self._do(api.array_tasks(array_id, "hold"))

    def release_array(self, array_id: str) -> TasksChanged:
        """:meth:`release` every held task of a job array; how many it released."""
        return self._do(api.array_tasks(array_id, "release"))

    def update(
        self,
        job_id: str,
        *,
        priority: int | None = None,
        gpus: int | None = None,
        timeout: float | str | None = None,
    ) -> Job:
        """Change a queued job's priority, GPUs or time limit (seconds, or "90m"), checked as a submit is;
        a job on a node, its time limit only."""
        return self._do(api.update(job_id, priority, gpus, timeout))

    def cancel_jobs(
        self, job_ids: Sequence[str] = (), *, user: str | None = None, state: str | None = None
    ) -> CancelReport:
        """Cancel the jobs named, or those ``user`` submitted, or in ``state`` (all given must match),
        within the token's tenant; ids no job holds come back in ``not_found``."""
        return self._do(api.cancel_jobs(job_ids, user, state))

    def requeue(self, array_id: str, *, failed: bool = True, cancelled: bool = False) -> RequeueReport:
        """Run a job array's FAILED (and with ``cancelled``, CANCELLED) tasks again under their ids."""
        return self._do(api.requeue(array_id, failed, cancelled))

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is final; raise :class:`JobTimeout` after ``timeout`` seconds."""
        timeout = checks.seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 30.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job = self._do(api.wait_once(job_id, left, self._timeout))
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
        return self._do(api.logs(job_id, attempt, rank))

    def follow_logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> Iterator[LogLine]:
        """Yield log lines as they arrive until the attempt is over and its stream drained."""
        conn, response = self._stream(*api.follow(job_id, attempt, rank))
        try:
            while line := response.readline():
                yield LogLine.model_validate_json(line)
        finally:
            response.close()
            conn.close()

    def download(
        self,
        job_id: str,
        path: str | None = None,
        dest: str | Path | None = None,
        *,
        checkpoint: str | None = None,
        force: bool = False,
    ) -> list[Path]:
        """Fetch the job's kept outputs (the latest attempt's ``outputs`` directory; ``path``: only
        what is under it) or, with ``checkpoint`` ("latest" or a name), one of its checkpoints, into
        ``dest`` (default ``./<job id>``); the files written. An existing file is replaced only with
        ``force``."""
        conn, response = self._stream(*api.download(job_id, path, checkpoint))
        try:
            target = Path(dest) if dest is not None else Path(check_job_id(job_id))
            return [target / name for name in unpack(response, target, force=force)]
        finally:
            response.close()
            conn.close()

    def _stream(
        self, path: str, query: dict[str, Any]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        return self.transport.stream(path, query)

    # -- nodes -------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return self._do(fleet_api.nodes())

    def most_gpus(self) -> int:
        """The most GPUs one live node has: a job asking for more stays QUEUED until such a node joins."""
        return self._do(fleet_api.most_gpus())

    def quarantined_nodes(self) -> dict[str, str]:
        """Nodes whose stored record cannot be read (name -> why); they get no jobs until it reads."""
        return self._do(api.quarantined("nodes"))

    def versions(self) -> FleetVersions:
        """Which release the API, the leading controller and each live node's agent run ("" for one
        that recorded none: 0.1.0 or older), and ``mixed`` when they differ. An API of 0.1.0 has no
        such route: :class:`NotFound` (and ``server_version`` is "")."""
        return self._do(fleet_api.versions())

    def redis_status(self) -> RedisStatus:
        """Which Redis is primary, its replicas and their lag, the sentinels that agree, and the
        failovers the fleet's services saw (operators and admins; read by the API every few seconds)."""
        return self._do(fleet_api.redis_status())

    def node(self, name: str) -> Node:
        return self._do(fleet_api.node(name))

    def cordon(self, name: str, reason: str = "") -> Node:
        """No new jobs on ``name``; running ones are untouched. Idempotent. Operators only."""
        return self._do(fleet_api.cordon(name, reason))

    def uncordon(self, name: str) -> Node:
        """Back to READY (also ends a drain). Operators only."""
        return self._do(fleet_api.uncordon(name))

    def drain(
        self,
        names: str | Sequence[str],
        *,
        deadline_s: float = 3600.0,
        grace_s: float = 60.0,
        force: bool = False,
        reason: str = "",
    ) -> list[Node]:
        """Cordon every node first (so work does not hop onto the next one), then drain them.

        Running jobs may finish until the deadline (``force``: now); then each gets SIGTERM and
        ``grace_s`` to checkpoint, and is requeued elsewhere without spending its retries.
        """
        return self._do(fleet_api.drain(names, deadline_s, grace_s, force, reason))

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
        return self._do(fleet_api.tenants())

    def set_tenant(self, name: str, **policy: Any) -> Tenant:
        """Create or replace a tenant's policy (``guaranteed_gpus``, ``max_gpus``, ``weight``,
        ``preempt_grace_s``, ``min_run_s``, ``allowed_users``; those left out get their defaults).
        Admins only."""
        return self._do(fleet_api.set_tenant(name, policy))

    def delete_tenant(self, name: str) -> Tenant:
        """Forget a tenant's policy: its jobs get the default one. Admins only."""
        return self._do(fleet_api.delete_tenant(name))

    # -- webhooks ----------------------------------------------------------------------

    def webhook_secret(self, tenant: str | None = None) -> str:
        """The secret the tenant's webhook deliveries are signed with (``X-Fleet-Signature-256``;
        check it with :func:`fleet.webhooks.verify`): the token's tenant's, or an admin's any."""
        return self._do(fleet_api.webhook_secret(tenant))

    def rotate_webhook_secret(self, tenant: str | None = None) -> str:
        """A new signing secret for the tenant, used from now on. Admins only."""
        return self._do(fleet_api.rotate_webhook_secret(tenant))

    def webhook_deliveries(self, tenant: str | None = None, limit: int = 100) -> list[WebhookOutcome]:
        """How the newest delivery attempts went, newest first (failures say why, and retries when
        the next attempt is due): the token's tenant's; an operator's every tenant's or ``tenant``'s."""
        return self._do(fleet_api.webhook_deliveries(tenant, limit))

    # -- identities --------------------------------------------------------------------

    def whoami(self) -> Identity:
        return self._do(fleet_api.whoami())

    def create_token(
        self, user: str, tenant: str, role: Role | str = Role.USER, expires_in_s: float | None = None
    ) -> tuple[str, TokenInfo]:
        """A new token (shown only now) and its record. Admins only."""
        return self._do(fleet_api.create_token(user, tenant, role, expires_in_s))

    def tokens(self) -> list[TokenInfo]:
        return self._do(fleet_api.tokens())

    def revoke_token(self, token_id: str) -> TokenInfo:
        return self._do(fleet_api.revoke_token(token_id))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close this thread's connection (the next call opens another)."""
        self.transport.close()
