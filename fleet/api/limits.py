"""How many blocking calls (a wait, a followed log) one token may hold at once.

Waiting holds neither a thread nor a Redis connection (:mod:`fleet.api.waiting`), but each waiter is
still memory and a stream in the process's one blocking read: one user opening thousands would make
that read slow for everyone. (Before the shared read, each wait held a thread and a connection: one
user's 250 waits took them all, and every other caller got 503 for 30 s.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fleet.errors import TooManyRequests
from fleet.models import Identity


class PerToken:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, who: Identity, what: str) -> None:
        """Count one more blocking call of ``who``'s token, or :class:`TooManyRequests`."""
        key = who.token_id or who.user
        with self._lock:
            held = self._held.get(key, 0)
            if held >= self.limit:
                raise TooManyRequests(
                    f"{what}: this token already holds {held} waits and followed logs, the most one token "
                    f"may (api.max_waits_per_token); let one end, then try again"
                )
            self._held[key] = held + 1

    def release(self, who: Identity) -> None:
        key = who.token_id or who.user
        with self._lock:
            held = self._held.get(key, 0) - 1
            if held > 0:
                self._held[key] = held
            else:
                self._held.pop(key, None)

    @contextmanager
    def hold(self, who: Identity, what: str) -> Iterator[None]:
        self.acquire(who, what)
        try:
            yield
        finally:
            self.release(who)
