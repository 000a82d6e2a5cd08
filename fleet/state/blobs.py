"""What jobs take along, kept in Redis by their SHA-256: directories shipped with jobs
(``fleet.workdir``), scaling profiles, functions' calls.

A blob lives ``ttl_s`` after its last upload or use by a submit: a job queued for longer than that
fails at launch saying its directory expired. A function's call is held by the jobs (and job arrays)
that name it instead, from their submit until retention deletes the last of them, which deletes it
(``lua/lib/blobs.lua``): it lives as long as their records. Blobs are bounded by the API's
``workdir_max_bytes``.

A blob is its uploaders': each tenant's uploads are recorded (``<p>:blobs:of:<tenant>``, also what
its ``blob_quota_bytes`` counts), and a tenant may use (:meth:`BlobStore.use`) only the blobs it
uploaded itself, so a digest learnt or guessed reaches nobody else's bytes, and whether another
tenant uploaded some content is never told. The same bytes uploaded by two tenants are stored once
and counted against each.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from fleet.errors import SpecError
from fleet.keys import Keys
from fleet.models import WorkdirSize
from fleet.state.connection import load_scripts, translated
from fleet.workdir import check_digest


class BlobStore:
    """On a client that returns bytes (``fleet.state.connection.connect_binary``)."""

    def __init__(self, redis: Any, keys: Keys, ttl_s: float) -> None:
        self.redis, self.keys, self.ttl_ms = redis, keys, int(ttl_s * 1000)

    @translated
    def put(
        self,
        digest: str,
        data: bytes,
        tenant: str | None = None,
        quota: int | None = None,
        size: WorkdirSize | None = None,
    ) -> bool:
        """Store the bytes (the caller checked their digest); False when they were there already
        (with ``tenant``: when that tenant had uploaded them already, whoever else did). With
        ``tenant``, the blob is its to use and counts against its ``quota`` (bytes) until it
        expires: :class:`SpecError` when it would go over (checked, then written: two uploads racing
        may pass it by one blob). ``size``: what a packed directory holds, kept as long as the blob."""
        hexdigest = check_digest(digest)
        held = tenant is not None and self._charge(tenant, hexdigest, len(data), quota)
        if size is not None:
            counts = f"{size.packed} {size.bytes} {size.files}"
            self.redis.set(self.keys.blob_size(hexdigest), counts, px=self.ttl_ms)
        if self.redis.set(self.keys.blob(hexdigest), data, px=self.ttl_ms, nx=True):
            return True
        self.use(digest, [] if tenant is None else [tenant])
        return tenant is not None and not held

    @translated
    def use(self, digest: str, tenants: Iterable[str]) -> bool:
        """Whether the blob is stored and one of ``tenants`` uploaded it (its upload not expired);
        if so it is kept another ``ttl_s`` (unless jobs hold it), and so is that tenant's upload,
        counted on against its quota. False, changing nothing, for a blob only other tenants
        uploaded, as for one never uploaded: the answer tells nothing of other tenants' uploads.
        With no tenants (a service's use): whether it is stored, kept so."""
        hexdigest = check_digest(digest)
        keys = [self.keys.blob(hexdigest), self.keys.blob_size(hexdigest), self.keys.blob_jobs(hexdigest)]
        keys += [self.keys.blobs_of(t) for t in dict.fromkeys(tenants)]
        args = [hexdigest, self.ttl_ms, int(time.time() * 1000)]
        return bool(load_scripts(self.redis)["blob_use"](keys=keys, args=args))

    @translated
    def size(self, digest: str) -> WorkdirSize | None:
        """What the packed directory holds, as found when it was uploaded; None for a blob that is not
        a packed directory, or one uploaded before sizes were recorded. Does not keep it longer."""
        raw = self.redis.get(self.keys.blob_size(check_digest(digest)))
        if raw is None:
            return None
        try:
            packed, content, files = (int(n) for n in raw.split())
            return WorkdirSize(packed=packed, bytes=content, files=files)
        except (ValueError, ValidationError):  # not what put wrote: no size is better than a wrong one
            return None

    def _charge(self, tenant: str, hexdigest: str, size: int, quota: int | None) -> bool:
        """Count the upload against the tenant's quota; whether it held the blob already."""
        key, now = self.keys.blobs_of(tenant), int(time.time() * 1000)
        held: dict[str, tuple[int, int]] = {}
        for field, value in self.redis.hgetall(key).items():
            count, _, until = value.decode().partition(" ")
            held[field.decode()] = (int(count), int(until or 0))
        gone = [h for h, (_, until) in held.items() if until <= now]
        used = sum(count for h, (count, until) in held.items() if until > now and h != hexdigest)
        if quota is not None and used + size > quota:
            raise SpecError(
                f"tenant {tenant!r} holds {used} bytes of uploads, and {size} more would pass its "
                f"blob_quota_bytes ({quota}); they count until they expire (workdir_retention_s), or "
                "leave data out of shipped directories (.fleetignore) and mount it"
            )
        pipe = self.redis.pipeline(transaction=False)
        if gone:
            pipe.hdel(key, *gone)
        pipe.hset(key, hexdigest, f"{size} {now + self.ttl_ms}")
        pipe.pexpire(key, self.ttl_ms)
        pipe.execute()
        return hexdigest in held and held[hexdigest][1] > now

    def touch(self, digest: str) -> bool:
        """Keep a blob another ``ttl_s`` (one held by jobs needs nothing), whoever uploaded it; False
        when it is not stored (never uploaded, or expired). Services only: what a tenant asks goes
        through :meth:`use`."""
        return self.use(digest, [])

    @translated
    def get(self, digest: str) -> bytes | None:
        data: bytes | None = self.redis.get(self.keys.blob(check_digest(digest)))
        return data
