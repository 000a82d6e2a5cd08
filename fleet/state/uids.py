"""Each tenant's job uid: one per tenant from ``agent.job_uid_range``, fleet-wide (``job_uid.lua``).

A tenant's jobs run as that uid (and the same number as gid) on every node, so the directories its
jobs own on shared storage stay theirs wherever they run next, and no other tenant's job can read
them. An offset, once given, is never taken back: a uid is never handed to a second tenant.
"""

from __future__ import annotations

from typing import Any

import redis

from fleet.errors import LaunchError
from fleet.keys import Keys
from fleet.state.connection import load_scripts, translated


class JobUids:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)
        self._known: dict[str, int] = {}  # tenant -> offset: fixed once given, so kept

    def uid(self, tenant: str, uid_range: tuple[int, int]) -> int:
        """``tenant``'s uid in ``uid_range`` (first uid, how many), given it now if it has none;
        :class:`LaunchError` (not retryable) once every uid of the range is some tenant's."""
        start, size = uid_range
        offset = self._known.get(tenant)
        if offset is None:
            offset = self._offset(tenant, size)
            if offset >= 0:
                self._known[tenant] = offset
        if offset < 0 or offset >= size:
            raise LaunchError(
                f"tenant {tenant!r} has no job uid: agent.job_uid_range ({start}-{start + size - 1}) "
                f"holds {size} uids and every one is another tenant's; an operator widens the range at "
                "its end (the same on every node, never moving its start)",
                retryable=False,
            )
        return start + offset

    @translated
    def _offset(self, tenant: str, size: int) -> int:
        return int(self._scripts["job_uid"](keys=[self.keys.job_uids], args=[tenant, size]))
