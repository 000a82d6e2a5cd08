"""Ship an attempt's output to its capped Redis stream, line by line, from a background thread."""

from __future__ import annotations

import logging
import threading

from fleet.agent.runtime.base import Runtime
from fleet.log import event
from fleet.state.jobs import JobStore

log = logging.getLogger("fleet.agent.logs")


class LogShipper(threading.Thread):
    def __init__(self, runtime: Runtime, jobs: JobStore, job_id: str, attempt: int, max_lines: int) -> None:
        super().__init__(name=f"logs-{job_id}-{attempt}", daemon=True)
        self.runtime, self.jobs = runtime, jobs
        self.job_id, self.attempt, self.max_lines = job_id, attempt, max_lines

    def run(self) -> None:
        try:
            cursor = self.jobs.last_log_cursor(self.job_id, self.attempt)
            for batch in self.runtime.logs(self.job_id, self.attempt, cursor):
                if cursor is not None:  # skip what was shipped before an agent restart
                    batch = [item for item in batch if not _not_after(item[0], cursor)]
                if batch:
                    self.jobs.append_logs(self.job_id, self.attempt, batch, self.max_lines)
        except Exception as exc:  # a broken stream (Redis, Docker) must never take the agent down
            event(
                log, "log_shipping_failed", logging.WARNING, job=self.job_id, attempt=self.attempt, error=exc
            )


def _not_after(cursor: str, last: str) -> bool:
    return float(cursor) <= float(last)
