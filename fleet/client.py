"""The Python API: ``Client().submit(JobSpec(...))`` and friends. The CLI is a thin layer over it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleet.bus import CONTROLLER_QUEUE, Bus, JobSubmitted, NodeChanged, Stop, node_queue
from fleet.config import Settings, load_settings
from fleet.errors import JobTimeout, SpecError
from fleet.keys import Keys
from fleet.models import Event, Job, JobSpec, JobState, Node, NodeState
from fleet.mounts import check_mounts
from fleet.state import JobStore, NodeStore, connect
from fleet.state.jobs import LogLine


class Client:
    """Talks to the fleet's Redis (``FLEET_REDIS_URL``, or ``config``/``redis_url``); no server needed."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        config: str | Path | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = settings or load_settings(config, redis_url=redis_url)
        client = connect(self.settings)
        keys = Keys(self.settings.key_prefix)
        self._jobs = JobStore(client, keys)
        self._nodes = NodeStore(client, keys)
        self._bus: Bus | None = None

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            self._bus = Bus(self.settings)
        return self._bus

    # -- jobs --------------------------------------------------------------------------

    def submit(self, spec: JobSpec | dict[str, Any], *, job_id: str | None = None) -> JobHandle:
        """Queue a job; with ``job_id`` a repeated submit of the same spec is a no-op (idempotent)."""
        if isinstance(spec, dict):
            spec = JobSpec.parse(spec)
        check_mounts(spec.mounts, self.settings.allowed_mounts)
        job_id = job_id or f"{spec.name[:40]}-{uuid.uuid4().hex[:8]}"
        if not self._jobs.create(job_id, spec, time.time()) and self._jobs.get(job_id).spec != spec:
            raise SpecError(f"job id {job_id!r} already exists with a different spec; choose another id")
        self.bus.send(CONTROLLER_QUEUE, JobSubmitted(job_id=job_id))
        return JobHandle(self, job_id)

    def get(self, job_id: str) -> Job:
        return self._jobs.get(job_id)

    def job(self, job_id: str) -> JobHandle:
        self._jobs.get(job_id)
        return JobHandle(self, job_id)

    def jobs(self, state: JobState | str | None = None, limit: int = 1000) -> list[Job]:
        return self._jobs.list_jobs(JobState(state) if state else None, limit)

    def history(self, job_id: str) -> list[Event]:
        self._jobs.get(job_id)
        return self._jobs.history(job_id)

    def cancel(self, job_id: str) -> Job:
        """Cancel: a queued job at once; a running one is stopped by its agent, then CANCELLED."""
        job = self._jobs.get(job_id)
        if job.state.final:
            return job
        self._jobs.request_cancel(job_id, time.time())
        job = self._jobs.get(job_id)
        if job.node and job.state.on_node:
            stop = Stop(job_id=job_id, attempt=job.attempt, reason="cancelled by user",
                        grace_s=self.settings.agent.stop_grace_s)  # fmt: skip
            self.bus.send(node_queue(job.node), stop)
        return job

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is final; raise :class:`JobTimeout` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = "0"
        while True:
            job = self._jobs.get(job_id)
            if job.state.final:
                return job
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JobTimeout(f"job {job_id} still {job.state} after {timeout:g}s")
            cursor = self._jobs.wait_event(job_id, cursor, max(1, int(min(left, 1.0) * 1000)))

    def logs(self, job_id: str, attempt: int | None = None) -> list[LogLine]:
        """Log lines of ``attempt`` (default: the latest)."""
        job = self._jobs.get(job_id)
        return self._jobs.read_logs(job_id, attempt or max(job.attempt, 1))

    def follow_logs(self, job_id: str, attempt: int | None = None, poll_s: float = 1.0) -> Iterator[LogLine]:
        """Yield log lines as they arrive until the attempt is over and its stream drained."""
        job = self._jobs.get(job_id)
        attempt = attempt or max(job.attempt, 1)
        cursor = "0"
        while True:
            lines = self._jobs.read_logs(job_id, attempt, cursor, block_ms=int(poll_s * 1000))
            yield from lines
            if lines:
                cursor = lines[-1].id
                continue
            job = self._jobs.get(job_id)
            if (
                job.attempt > attempt
                or job.state.final
                or (job.attempt == attempt and job.state == JobState.QUEUED)
            ):
                return

    # -- nodes -------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return self._nodes.all()

    def node(self, name: str) -> Node:
        return self._nodes.get(name)

    def cordon(self, name: str, reason: str = "") -> Node:
        """No new jobs on ``name``; running ones are untouched. Idempotent."""
        self._nodes.set_state(name, NodeState.CORDONED, reason or "cordoned", time.time())
        return self._nodes.get(name)

    def uncordon(self, name: str) -> Node:
        self._nodes.set_state(name, NodeState.READY, "uncordoned", time.time())
        self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=name))
        return self._nodes.get(name)

    def close(self) -> None:
        self._jobs.redis.close()
        if self._bus is not None:
            self._bus.close()


class JobHandle:
    """A submitted job: wait for it, read its logs, cancel it."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def status(self) -> Job:
        return self.client.get(self.id)

    def wait(self, timeout: float | None = None) -> Job:
        return self.client.wait(self.id, timeout)

    def logs(self, attempt: int | None = None) -> str:
        return "\n".join(line.line for line in self.client.logs(self.id, attempt))

    def history(self) -> list[Event]:
        return self.client.history(self.id)

    def cancel(self) -> Job:
        return self.client.cancel(self.id)
