"""The Python API for asyncio (notebooks, services): :class:`AsyncClient` has :class:`fleet.Client`'s
methods as coroutines, its handles ``await handle.result()``, and a followed log is an async iterator.

How: each call is an endpoint of :mod:`fleet.client.endpoints` (the same declaration the sync client
sends) sent by the client's :class:`~fleet.client.transport.Transport` on a small thread pool of this
client (``max_threads``, 16 by default), each thread with its own kept-alive connection: an ``await``
never blocks the event loop, and errors are the same fleet errors. No async HTTP library is needed
(``import fleet`` stays fast). At most ``max_threads`` calls are in flight at once; a followed log
holds one thread while it waits for its next line (leaving the loop or cancelling the task closes
its connection and frees the thread at once). What takes several calls (a submit that ships a
directory, a wait longer than the API's 30 s) runs :class:`fleet.Client`'s own method on the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.client import checks
from fleet.client import endpoints as api
from fleet.client import fleet_endpoints as fleet_api
from fleet.client.calls import Call
from fleet.client.handles import ALL_COMPLETED, FIRST_COMPLETED
from fleet.client.sync import Client
from fleet.errors import JobCancelled, JobFailed, JobTimeout, SpecError
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
    Progress,
    QueuePosition,
    RedisStatus,
    RequeueReport,
    Role,
    TasksChanged,
    Tenant,
    TenantStatus,
    TokenInfo,
    WebhookOutcome,
)
from fleet.models.usage import History

if TYPE_CHECKING:
    from fleet.client.workdir import Progress, Shipped

T = TypeVar("T")
#: longest one round of :meth:`AsyncClient.wait` holds a pool thread
WAIT_ROUND_S = 10.0


class AsyncClient:
    """``async with AsyncClient() as fleet: handle = await fleet.submit(spec); await handle.result()``.
    Arguments as :class:`fleet.Client` (URL, token, ``ca_file``, ``timeout``)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ca_file: str | None = None,
        timeout: float = 60.0,
        max_threads: int = 16,
    ) -> None:
        self.sync = Client(url, token, ca_file=ca_file, timeout=timeout)
        self.url = self.sync.url
        threads = checks.count(max_threads, "max_threads", 1, 1024)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="fleet-aio")
        self.closed = False

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))

    async def _do(self, call: Call[T]) -> T:
        return await self._run(self.sync.transport.call, call)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection and end the pool's threads."""
        self.closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.sync.transport.close_all()

    # -- jobs --------------------------------------------------------------------------

    async def submit(
        self,
        spec: JobSpec | dict[str, Any],
        *,
        job_id: str | None = None,
        after: Iterable[object] | None = None,
    ) -> AsyncJobHandle:
        handle = await self._run(self.sync.submit, spec, job_id=job_id, after=after)
        return AsyncJobHandle(self, handle.id)

    async def submit_many(
        self,
        specs: Iterable[JobSpec | dict[str, Any]],
        *,
        job_ids: Sequence[str | None] | None = None,
        after: Iterable[object] | None = None,
    ) -> list[AsyncJobHandle]:
        """As :meth:`fleet.Client.submit_many`: up to 1,000 jobs in one call, all or nothing."""
        handles = await self._run(self.sync.submit_many, list(specs), job_ids=job_ids, after=after)
        return [AsyncJobHandle(self, h.id) for h in handles]

    async def submit_array(
        self,
        spec: JobSpec | dict[str, Any],
        indices: str | Iterable[int],
        *,
        max_running: int | None = None,
        array_id: str | None = None,
    ) -> AsyncArrayHandle:
        handle = await self._run(
            self.sync.submit_array, spec, indices, max_running=max_running, array_id=array_id
        )
        return AsyncArrayHandle(self, handle.id)

    async def upload_workdir(self, path: str) -> str:
        return await self._run(self.sync.upload_workdir, path)

    async def ship_workdir(self, path: str, progress: Progress | None = None) -> Shipped:
        return await self._run(self.sync.ship_workdir, path, progress)

    async def upload_profile(self, path: str) -> str:
        return await self._run(self.sync.upload_profile, path)

    async def upload_blob(self, data: bytes) -> str:
        return await self._run(self.sync.upload_blob, data)

    @property
    def server_version(self) -> str:
        """As :attr:`fleet.Client.server_version`: what the API's last answer named, not a call."""
        return self.sync.server_version

    async def get(self, job_id: str) -> Job:
        return await self._do(api.get(job_id))

    async def job(self, job_id: str) -> AsyncJobHandle:
        """A handle on a job submitted earlier (:class:`NotFound` if there is none)."""
        await self.get(job_id)
        return AsyncJobHandle(self, job_id)

    async def array(self, array_id: str) -> JobArray:
        return await self._do(api.get_array(array_id))

    async def listing(
        self,
        state: JobState | str | None = None,
        limit: int = 100,
        tenant: str | None = None,
        user: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[Job | JobArray]:
        return await self._do(api.listing(api.filters(state, limit, tenant, user, labels)))

    async def jobs(
        self,
        state: JobState | str | None = None,
        limit: int = 1000,
        tenant: str | None = None,
        user: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[Job]:
        return await self._do(api.jobs(api.filters(state, limit, tenant, user, labels)))

    async def quarantined_jobs(self) -> dict[str, str]:
        return await self._do(api.quarantined("jobs"))

    async def position(self, job_id: str) -> QueuePosition | None:
        return await self._do(api.position(job_id))

    async def history(self, job_id: str) -> list[Event]:
        return await self._do(api.history(job_id))

    async def usage(
        self,
        since: float | str = "30d",
        until: float | str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        by: str = "user",
        limit: int = 1000,
    ) -> History:
        """:meth:`fleet.Client.usage`."""
        return await self._do(api.usage(since, until, tenant, user, by, limit))

    async def cancel(self, job_id: str) -> Job:
        return await self._do(api.cancel(job_id))

    async def send_stdin(self, job_id: str, data: bytes, eof: bool = False) -> int:
        return await self._do(api.send_stdin(job_id, data, eof))

    async def resize(self, job_id: str, gpus: int, batch_size: int | None = None) -> Job:
        return await self._do(api.resize(job_id, gpus, batch_size))

    async def cancel_array(self, array_id: str) -> CancelReport:
        return await self._do(api.cancel_array(array_id))

    async def cancel_labels(self, labels: dict[str, str]) -> CancelReport:
        return await self._do(api.cancel_labels(labels))

    async def hold(self, job_id: str) -> Job:
        return await self._do(api.hold(job_id))

    async def release(self, job_id: str) -> Job:
        return await self._do(api.release(job_id))

    async def hold_array(self, array_id: str) -> TasksChanged:
        return await self._do(api.array_tasks(array_id, "hold"))

    async def release_array(self, array_id: str) -> TasksChanged:
        return await self._do(api.array_tasks(array_id, "release"))

    async def update(
        self,
        job_id: str,
        *,
        priority: int | None = None,
        gpus: int | None = None,
        timeout: float | str | None = None,
    ) -> Job:
        return await self._do(api.update(job_id, priority, gpus, timeout))

    async def cancel_jobs(
        self, job_ids: Sequence[str] = (), *, user: str | None = None, state: str | None = None
    ) -> CancelReport:
        return await self._do(api.cancel_jobs(job_ids, user, state))

    async def requeue(self, array_id: str, *, failed: bool = True, cancelled: bool = False) -> RequeueReport:
        return await self._do(api.requeue(array_id, failed, cancelled))

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once final; :class:`JobTimeout` after ``timeout`` seconds. Waited for on the pool
        in rounds of at most :data:`WAIT_ROUND_S`, so that a wait cancelled (``asyncio.wait_for``, a
        task's cancel) frees its thread within a round rather than when the job ends."""
        timeout = checks.seconds(timeout)
        deadline = _deadline(timeout)
        while True:
            left = WAIT_ROUND_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await self._run(self.sync.wait, job_id, min(left, WAIT_ROUND_S))
            except JobTimeout as exc:
                if left <= WAIT_ROUND_S and deadline is not None:
                    raise JobTimeout(f"job {job_id} not final after {timeout:g}s") from exc

    async def logs(self, job_id: str, attempt: int | None = None, rank: int = 0) -> list[LogLine]:
        return await self._do(api.logs(job_id, attempt, rank))

    async def follow_logs(
        self, job_id: str, attempt: int | None = None, rank: int = 0
    ) -> AsyncIterator[LogLine]:
        """``async for line in client.follow_logs(id)``: each line as it is written, until the
        attempt is over. Leaving the loop early closes the stream's connection."""
        path, query = api.follow(job_id, attempt, rank)
        conn, response = await self._run(self.sync.transport.stream, path, query)
        try:
            while line := await self._run(response.readline):
                yield LogLine.model_validate_json(line)
        finally:
            if conn.sock is not None:  # wakes a pool thread still blocked reading (a cancelled task)
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()

    async def download(
        self,
        job_id: str,
        path: str | None = None,
        dest: str | Path | None = None,
        *,
        checkpoint: str | None = None,
        force: bool = False,
    ) -> list[Path]:
        """As :meth:`fleet.Client.download`, on a pool thread."""
        return await self._run(self.sync.download, job_id, path, dest, checkpoint=checkpoint, force=force)

    # -- nodes, tenants, identities ---------------------------------------------------------

    async def nodes(self) -> list[Node]:
        return await self._do(fleet_api.nodes())

    async def node(self, name: str) -> Node:
        return await self._do(fleet_api.node(name))

    async def most_gpus(self) -> int:
        return await self._do(fleet_api.most_gpus())

    async def quarantined_nodes(self) -> dict[str, str]:
        return await self._do(api.quarantined("nodes"))

    async def versions(self) -> FleetVersions:
        return await self._do(fleet_api.versions())

    async def redis_status(self) -> RedisStatus:
        return await self._do(fleet_api.redis_status())

    async def cordon(self, name: str, reason: str = "") -> Node:
        return await self._do(fleet_api.cordon(name, reason))

    async def uncordon(self, name: str) -> Node:
        return await self._do(fleet_api.uncordon(name))

    async def drain(
        self,
        names: str | list[str],
        *,
        deadline_s: float = 3600.0,
        grace_s: float = 60.0,
        force: bool = False,
        reason: str = "",
    ) -> list[Node]:
        return await self._do(fleet_api.drain(names, deadline_s, grace_s, force, reason))

    async def wait_drained(
        self,
        names: str | Sequence[str],
        timeout: float | None = None,
        progress: Callable[[list[Node]], None] | None = None,
    ) -> list[Node]:
        """As :meth:`fleet.Client.wait_drained` (``progress`` is called on a pool thread)."""
        return await self._run(self.sync.wait_drained, names, timeout, progress)

    async def tenants(self) -> list[TenantStatus]:
        return await self._do(fleet_api.tenants())

    async def set_tenant(self, name: str, **policy: Any) -> Tenant:
        return await self._do(fleet_api.set_tenant(name, policy))

    async def delete_tenant(self, name: str) -> Tenant:
        return await self._do(fleet_api.delete_tenant(name))

    async def webhook_secret(self, tenant: str | None = None) -> str:
        return await self._do(fleet_api.webhook_secret(tenant))

    async def rotate_webhook_secret(self, tenant: str | None = None) -> str:
        return await self._do(fleet_api.rotate_webhook_secret(tenant))

    async def webhook_deliveries(self, tenant: str | None = None, limit: int = 100) -> list[WebhookOutcome]:
        return await self._do(fleet_api.webhook_deliveries(tenant, limit))

    async def whoami(self) -> Identity:
        return await self._do(fleet_api.whoami())

    async def create_token(
        self, user: str, tenant: str, role: Role | str = Role.USER, expires_in_s: float | None = None
    ) -> tuple[str, TokenInfo]:
        return await self._do(fleet_api.create_token(user, tenant, role, expires_in_s))

    async def tokens(self) -> list[TokenInfo]:
        return await self._do(fleet_api.tokens())

    async def revoke_token(self, token_id: str) -> TokenInfo:
        return await self._do(fleet_api.revoke_token(token_id))


class AsyncJobHandle:
    """A submitted job, for asyncio: ``await handle.result()``, ``async for line in handle.follow_logs()``."""

    def __init__(self, client: AsyncClient, job_id: str) -> None:
        self.client, self.id = client, job_id

    def __repr__(self) -> str:
        return f"AsyncJobHandle({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncJobHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def status(self) -> Job:
        return await self.client.get(self.id)

    async def done(self) -> bool:
        return (await self.status()).state.final

    async def progress(self) -> Progress | None:
        return (await self.status()).progress

    async def wait(self, timeout: float | None = None) -> Job:
        return await self.client.wait(self.id, timeout)

    async def result(self, timeout: float | None = None) -> Job:
        """The final status once SUCCEEDED; :class:`JobFailed` or :class:`JobCancelled` otherwise."""
        job = await self.wait(timeout)
        if job.state == JobState.CANCELLED:
            raise JobCancelled(job, f"job {job.id} CANCELLED: {job.reason}")
        if job.state == JobState.FAILED:
            raise JobFailed(job, f"job {job.id} FAILED: {job.reason}")
        return job

    async def logs(self, attempt: int | None = None, rank: int = 0) -> str:
        """The attempt's output so far; :meth:`follow_logs` streams it."""
        return "\n".join(line.line for line in await self.client.logs(self.id, attempt, rank))

    async def follow_logs(self, attempt: int | None = None, rank: int = 0) -> AsyncIterator[str]:
        async for line in self.client.follow_logs(self.id, attempt, rank):
            yield line.line

    async def download(
        self,
        path: str | None = None,
        dest: str | Path | None = None,
        *,
        checkpoint: str | None = None,
        force: bool = False,
    ) -> list[Path]:
        return await self.client.download(self.id, path, dest, checkpoint=checkpoint, force=force)

    async def history(self) -> list[Event]:
        return await self.client.history(self.id)

    async def cancel(self) -> Job:
        return await self.client.cancel(self.id)


class AsyncArrayHandle:
    """A submitted job array, for asyncio."""

    def __init__(self, client: AsyncClient, array_id: str) -> None:
        self.client, self.id = client, array_id

    def __repr__(self) -> str:
        return f"AsyncArrayHandle({self.id!r})"

    async def status(self) -> JobArray:
        return await self.client.array(self.id)

    def task(self, index: int) -> AsyncJobHandle:
        from fleet.models.arrays import task_id

        return AsyncJobHandle(self.client, task_id(self.id, checks.count(index, "index", 0, 10**9)))

    async def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> JobArray:
        """Every task final; :class:`JobTimeout` after ``timeout`` seconds."""
        deadline = _deadline(timeout)
        while not (array := await self.status()).done:
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job array {self.id}: not every task final after {timeout:g}s")
            await asyncio.sleep(checks.seconds(poll_s, "poll_s") or 0.5)
        return array

    async def cancel(self) -> CancelReport:
        return await self.client.cancel_array(self.id)


async def wait(
    handles: Iterable[AsyncJobHandle],
    timeout: float | None = None,
    return_when: str = ALL_COMPLETED,
    poll_s: float = 0.5,
) -> tuple[set[AsyncJobHandle], set[AsyncJobHandle]]:
    """(done, not done), as ``asyncio.wait``: once any job is final (``FIRST_COMPLETED``) or all
    are (``ALL_COMPLETED``), or after ``timeout`` seconds. Each round asks for every pending job at once."""
    if return_when not in (FIRST_COMPLETED, ALL_COMPLETED):
        raise SpecError(f"return_when {return_when!r}: expected FIRST_COMPLETED or ALL_COMPLETED")
    pending, finished = set(handles), set[AsyncJobHandle]()
    deadline, poll_s = _deadline(timeout), checks.seconds(poll_s, "poll_s") or 0.5
    while True:
        order = list(pending)
        states = await asyncio.gather(*(h.done() for h in order))
        finished |= {h for h, final in zip(order, states, strict=True) if final}
        pending -= finished
        if not pending or (return_when == FIRST_COMPLETED and finished):
            return finished, pending
        if deadline is not None and time.monotonic() >= deadline:
            return finished, pending
        await asyncio.sleep(poll_s)


async def as_completed(
    handles: Iterable[AsyncJobHandle], timeout: float | None = None, poll_s: float = 0.5
) -> AsyncIterator[AsyncJobHandle]:
    """``async for handle in as_completed(handles)``: each as its job becomes final;
    :class:`JobTimeout` if some are not after ``timeout`` seconds."""
    pending, deadline = set(handles), _deadline(timeout)
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        finished, pending = await wait(pending, left, FIRST_COMPLETED, poll_s)
        if not finished:
            raise JobTimeout(f"{len(pending)} jobs not final after {timeout:g}s")
        for handle in sorted(finished, key=lambda h: h.id):
            yield handle


def _deadline(timeout: float | None) -> float | None:
    timeout = checks.seconds(timeout)
    return None if timeout is None else time.monotonic() + timeout
