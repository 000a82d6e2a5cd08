"""Directories shipped with jobs (``fleet.workdir``), kept in Redis by their SHA-256.

A blob lives ``ttl_s`` after its last upload or use by a submit: a job queued for longer than that
fails at launch saying its directory expired. Blobs are bounded by the API's ``workdir_max_bytes``.
"""

from __future__ import annotations

from typing import Any

from fleet.keys import Keys
from fleet.state.connection import translated
from fleet.workdir import check_digest


class BlobStore:
    """On a client that returns bytes (``fleet.state.connection.connect_binary``)."""

    def __init__(self, redis: Any, keys: Keys, ttl_s: float) -> None:
        self.redis, self.keys, self.ttl_ms = redis, keys, int(ttl_s * 1000)

    @translated
    def put(self, digest: str, data: bytes) -> bool:
        """Store the bytes (the caller checked their digest); False when they were there already."""
        if self.redis.set(self.keys.blob(check_digest(digest)), data, px=self.ttl_ms, nx=True):
            return True
        self.touch(digest)
        return False

    @translated
    def touch(self, digest: str) -> bool:
        """Keep a blob another ``ttl_s``; False when it is not stored (never uploaded, or expired)."""
        return bool(self.redis.pexpire(self.keys.blob(check_digest(digest)), self.ttl_ms))

    @translated
    def get(self, digest: str) -> bytes | None:
        data: bytes | None = self.redis.get(self.keys.blob(check_digest(digest)))
        return data
