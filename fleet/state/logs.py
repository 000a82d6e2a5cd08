"""Job logs in Redis: a stream per attempt and member rank, capped, with the runtime's cursor."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.keys import Keys
from fleet.models import LogLine, Progress
from fleet.progress import FOLLOWS_BATCH
from fleet.state.connection import translated


class JobLogs:
    """The log streams of :class:`fleet.state.jobs.JobStore` (which it is a part of)."""

    redis: Any
    keys: Keys
    _scripts: dict[str, Any]

    @translated
    def append_logs(self, job_id: str, attempt: int, lines: list[tuple[str, str]], max_lines: int) -> None:
        """Append ``(cursor, line)`` pairs; the runtime's cursor lets a restarted agent resume shipping."""
        self.append_logs_many({(job_id, attempt, 0): lines}, max_lines)

    @translated
    def append_logs_many(
        self,
        batches: Mapping[tuple[str, int, int], Sequence[tuple[str, str]]],
        max_lines: int,
        progress: Mapping[tuple[str, int], Progress] | None = None,
        caps: Mapping[tuple[str, int, int], int] | None = None,
    ) -> None:
        """Append every stream's ``(cursor, line)`` pairs (a stream: job, attempt, member rank), in
        order, each stream kept to its last ``caps[stream]`` lines (``max_lines`` by default), and
        keep each attempt's last ``progress`` report (progress.lua: only the job's latest
        attempt's), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for stream, lines in batches.items():
            key = self.keys.logs(*stream)
            cap = (caps or {}).get(stream, max_lines)
            for cursor, line in lines:
                pipe.xadd(key, {"l": line, "c": cursor}, maxlen=cap, approximate=True)
        for (job_id, attempt), report in (progress or {}).items():
            stored = json.dumps({"attempt": attempt, **report.model_dump(mode="json")})
            found = report.metrics
            rate, gns = found.get("samples_per_s", ""), found.get("gns", "")
            # one that follows a batch change in place may report the batch it had before the change
            batch = found.get("batch_size", "") if found.get(FOLLOWS_BATCH) else ""
            self._scripts["progress"](
                keys=[self.keys.job(job_id)], args=[attempt, stored, rate, gns, batch], client=pipe
            )
        pipe.execute()

    @translated
    def last_log_cursors(self, streams: Sequence[tuple[str, int, int]]) -> list[str | None]:
        """The cursor of the last line stored in each stream (job, attempt, member rank; None: none
        yet), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id, attempt, rank in streams:
            pipe.xrevrange(self.keys.logs(job_id, attempt, rank), count=1)
        return [str(last[0][1]["c"]) if last else None for last in pipe.execute()]

    @translated
    def log_tail(self, job_id: str, attempt: int, count: int, rank: int = 0) -> list[str]:
        """The attempt's last ``count`` lines, oldest first."""
        entries = self.redis.xrevrange(self.keys.logs(job_id, attempt, rank), count=count)
        return [f["l"] for _, f in reversed(entries)]

    @translated
    def read_logs(
        self, job_id: str, attempt: int, after: str = "0", block_ms: int | None = None, rank: int = 0
    ) -> list[LogLine]:
        key = self.keys.logs(job_id, attempt, rank)
        if block_ms is None:
            entries = self.redis.xrange(key, min=f"({after}" if after != "0" else "-")
        else:
            got = self.redis.xread({key: after}, block=block_ms)
            entries = got[0][1] if got else []
        return [LogLine(id=eid, attempt=attempt, line=f["l"]) for eid, f in entries]
