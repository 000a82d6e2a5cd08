"""One blocking read for every waiter of a process: which watched streams grew.

A wait for a job and a followed log each used to block in a Redis read of their own, holding a
connection (and a server thread) for up to 30 s: 250 of them took the API's whole pool, and every
other caller got 503. Here one thread per process, on one connection of its own, blocks in a single
``XREAD`` over every stream some waiter watches (a job's ``events``, an attempt's ``logs``) and tells
each waiter whose stream grew past where it read; the waiter reads what is new itself, in a short
call. A waiter that is dropped costs nothing more: its streams leave the next read.

A stream a waiter adds while the thread blocks wakes it through the process's own wake stream
(``<p>:api:wake:<id>``, one entry, expiring), so the new stream is read at once.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import redis

from fleet.config import Settings
from fleet.keys import Keys
from fleet.log import event
from fleet.state.connection import pool

log = logging.getLogger("fleet.state.watch")
#: the longest one read blocks: a stream no waiter wants any more leaves the read by then
BLOCK_S = 5.0
#: entries one read takes per stream (only the newest id matters; the rest come on the next read)
COUNT = 100
#: how long a wake stream outlives its last wake (a process killed outright leaves it that long)
WAKE_TTL_S = 3600
#: after a failed read, the pause before the next (doubling up to the most)
RETRY_S, RETRY_MAX_S = 0.2, 5.0

StreamId = tuple[int, int]


def stream_id(raw: str) -> StreamId:
    """``"1700000000000-3"`` as a pair that orders like Redis orders ids (``"0"``: before every entry)."""
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


class Interest:
    """One waiter's streams and where it read each to; ``notify`` (called on another thread) once
    one of them holds more."""

    def __init__(self, notify: Callable[[], object]) -> None:
        self.notify = notify
        self.cursors: dict[str, StreamId] = {}


class StreamWatch:
    def __init__(self, settings: Settings, keys: Keys, writer: Any) -> None:
        """``writer``: a client of the process's pool, for the wake entry (the read has its own)."""
        timeout = BLOCK_S + 5  # a blocked read is answered within BLOCK_S: longer means Redis is gone
        self._reader: Any = redis.Redis(
            connection_pool=pool(settings, decode_responses=True, socket_timeout=timeout, max_connections=1)
        )
        self._writer = writer
        self.wake_key = keys.wake(secrets.token_hex(8))
        self._lock = threading.Lock()
        self._wanted: dict[str, set[Interest]] = {}
        #: per watched stream, the newest id seen: the next read reads past it
        self._seen: dict[str, StreamId] = {}
        self._wake_cursor = "0"
        self._woken = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- waiters -----------------------------------------------------------------------

    @contextmanager
    def interest(self, notify: Callable[[], object]) -> Iterator[Interest]:
        """A waiter's interest, dropped from every read once the block ends."""
        interest = Interest(notify)
        try:
            yield interest
        finally:
            self.drop(interest)

    def want(self, interest: Interest, cursors: Mapping[str, str]) -> None:
        """Watch exactly ``cursors`` (stream -> the last id the waiter read, ``"0"``: none) for
        ``interest``; notified at once when a stream already holds more than it read. Does Redis I/O
        (the wake) when a stream is new to the read: call it on a worker thread."""
        fire = wake = False
        with self._lock:
            self._start()
            for key in set(interest.cursors) - set(cursors):
                self._unwant(interest, key)
            for key, raw in cursors.items():
                cursor = interest.cursors[key] = stream_id(raw)
                if key not in self._wanted:
                    self._wanted[key], self._seen[key] = set(), cursor
                    wake = wake or not self._woken
                self._wanted[key].add(interest)
                fire = fire or self._seen[key] > cursor
            self._woken = self._woken or wake
        if wake:
            self._wake()
        if fire:
            _notify(interest)

    def drop(self, interest: Interest) -> None:
        with self._lock:
            for key in list(interest.cursors):
                self._unwant(interest, key)

    def _unwant(self, interest: Interest, key: str) -> None:
        interest.cursors.pop(key, None)
        others = self._wanted.get(key)
        if others is not None:
            others.discard(interest)
            if not others:
                del self._wanted[key], self._seen[key]

    def watched(self) -> tuple[int, int]:
        """(streams watched, waiters watching): what ``fleet api`` holds open."""
        with self._lock:
            interests = {i for wanting in self._wanted.values() for i in wanting}
            return len(self._wanted), len(interests)

    # -- the reading thread -------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="fleet-stream-watch", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        try:
            pipe = self._writer.pipeline(transaction=False)
            pipe.xadd(self.wake_key, {"w": "1"}, maxlen=1, approximate=False)
            pipe.expire(self.wake_key, WAKE_TTL_S)
            pipe.execute()
        except redis.RedisError as exc:  # the new stream is read once the current read ends
            event(log, "watch_wake_failed", logging.WARNING, error=exc, effect=f"up to {BLOCK_S:g}s late")

    def _run(self) -> None:
        retry = RETRY_S
        while not self._stop.is_set():
            with self._lock:
                streams = {key: f"{ms}-{seq}" for key, (ms, seq) in self._seen.items()}
                self._woken = False
            streams[self.wake_key] = self._wake_cursor
            try:
                got = self._reader.xread(streams, block=int(BLOCK_S * 1000), count=COUNT)
            except Exception as exc:  # Redis away or restarting: read again, from the same ids
                if self._stop.is_set():
                    return
                event(log, "watch_read_failed", logging.WARNING, error=exc, retry_s=retry)
                self._stop.wait(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            retry = RETRY_S
            self._grown(got or [])

    def _grown(self, got: list[Any]) -> None:
        fired: set[Interest] = set()
        with self._lock:
            for key, entries in got:
                if not entries:
                    continue
                if key == self.wake_key:
                    self._wake_cursor = entries[-1][0]
                    continue
                newest = stream_id(entries[-1][0])
                if key not in self._seen:
                    continue  # nobody wants it any more
                self._seen[key] = max(self._seen[key], newest)
                fired.update(i for i in self._wanted[key] if i.cursors.get(key, newest) < newest)
        for interest in fired:
            _notify(interest)

    def close(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(redis.RedisError):  # else it expires
            self._writer.delete(self.wake_key)
        self._reader.close()


def _notify(interest: Interest) -> None:
    with contextlib.suppress(RuntimeError):  # its event loop is closed: the server is stopping
        interest.notify()
