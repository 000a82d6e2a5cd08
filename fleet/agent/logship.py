"""Ship an attempt's output to its capped Redis stream, one batch per runtime read, from a thread.

While Redis is unreachable the shipper holds its batch and retries with backoff, so a Redis
restart loses no log line; the runtime keeps buffering (Docker's log, the attempt's file).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from fleet.agent.runtime.base import Runtime
from fleet.errors import FleetError
from fleet.log import event
from fleet.state.jobs import JobStore

log = logging.getLogger("fleet.agent.logs")
T = TypeVar("T")


class LogShipper(threading.Thread):
    def __init__(
        self,
        runtime: Runtime,
        jobs: JobStore,
        job_id: str,
        attempt: int,
        max_lines: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"logs-{job_id}-{attempt}", daemon=True)
        self.runtime, self.jobs, self.stop = runtime, jobs, stop
        self.job_id, self.attempt, self.max_lines = job_id, attempt, max_lines

    def run(self) -> None:
        try:
            cursor = self._retrying(lambda: self.jobs.last_log_cursor(self.job_id, self.attempt))
            for batch in self.runtime.logs(self.job_id, self.attempt, cursor):
                if cursor is not None:  # skip what was shipped before an agent restart
                    batch = [item for item in batch if float(item[0]) > float(cursor)]
                if batch:
                    ship = functools.partial(
                        self.jobs.append_logs, self.job_id, self.attempt, batch, self.max_lines
                    )
                    self._retrying(ship)
        except Exception as exc:  # a broken runtime stream must never take the agent down
            event(
                log, "log_shipping_failed", logging.WARNING, job=self.job_id, attempt=self.attempt, error=exc
            )

    def _retrying(self, call: Callable[[], T]) -> T:
        delay = 0.1
        while True:
            try:
                return call()
            except FleetError as exc:
                if not exc.retryable or self.stop.wait(delay):
                    raise
                delay = min(delay * 2, 2.0)
