"""How many blocking calls (a wait, a followed log) one token may hold at once.

Each holds a worker thread and, while it blocks, a Redis connection: without a bound one user's 250
waits took every thread and connection, and every other caller got 503 for 30 s.
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

    def holding(self, who: Identity, what: str, items: Iterator[bytes]) -> Iterator[bytes]:
        """``items`` (a streamed answer) counted as one call of ``who`` until it ends or is closed;
        :class:`TooManyRequests` now, before the answer starts, when the token holds its most."""
        self.acquire(who, what)
        return self._released(who, items)

    def _released(self, who: Identity, items: Iterator[bytes]) -> Iterator[bytes]:
        try:
            yield from items
        finally:
            self.release(who)
