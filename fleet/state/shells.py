"""``fleet shell`` sessions in Redis: the bytes between the API and the agent of the job's node.

Redis is the only channel the two share. The API offers a session (a key that lives ``OFFER_S``)
and tells the node's agent on the bus; the agent takes the offer (deletes the key: a redelivered
message, or one that arrives after the offer lapsed, starts nothing). Then two streams carry the
session: ``in`` (API -> agent: ``d`` bytes typed, ``eof``, ``resize`` "ROWS COLS", ``close``) and
``out`` (agent -> API: ``o``/``e`` output bytes, ``started``, ``exit`` CODE, ``error`` JSON). Each
expires ``TTL_S`` after its last entry and is deleted when the session ends.
"""

from __future__ import annotations

from typing import Any

from fleet.keys import Keys

#: how long an offer waits for the node's agent to take it
OFFER_S = 30
#: a stream left by a side that died expires this long after its last entry
TTL_S = 600
#: entries a stream keeps at most (a reader that falls this far behind loses the oldest output)
MAX_ENTRIES = 10_000

Entry = tuple[bytes, dict[bytes, bytes]]


class ShellRelay:
    """The sessions' keys, on a client that returns bytes (what a terminal sends is not text)."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    def offer(self, session: str) -> None:
        self.redis.set(self.keys.shell(session), b"1", ex=OFFER_S)

    def take(self, session: str) -> bool:
        """Whether this caller took the offer (it was there, and nobody took it before)."""
        return bool(self.redis.delete(self.keys.shell(session)))

    def put(self, session: str, side: str, fields: dict[str, bytes | str | int]) -> None:
        key = self.keys.shell(session, side)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(key, fields, maxlen=MAX_ENTRIES, approximate=True)
        pipe.expire(key, TTL_S)
        pipe.execute()

    def read(self, session: str, side: str, after: bytes, block_ms: int | None = None) -> list[Entry]:
        """Entries of the ``side`` stream past ``after`` (``b"0"``: from the start); with ``block_ms``,
        waiting that long for one."""
        key = self.keys.shell(session, side)
        if block_ms is None:
            return list(self.redis.xrange(key, min=b"(" + after if after != b"0" else b"-", count=100))
        got = self.redis.xread({key: after}, count=100, block=block_ms)
        return list(got[0][1]) if got else []

    def hung_up(self, session: str) -> bool:
        """Whether the caller hung up: the API's last entry in ``in`` is its ``close`` (read without
        reading the input before it, which a command that does not read its stdin leaves waiting)."""
        last = self.redis.xrevrange(self.keys.shell(session, "in"), count=1)
        return bool(last) and b"close" in last[0][1]

    def drop(self, session: str, *sides: str) -> None:
        """Delete the session's ``sides`` (none: its offer and both streams)."""
        self.redis.delete(*(self.keys.shell(session, side) for side in sides or ("", "in", "out")))
