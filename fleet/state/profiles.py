"""Scaling profiles users upload (``fleet submit --profile ./dir``): a blob holding the profile's
JSON (``fleet.scheduler.profiles.profile_data``), named by its SHA-256 like a shipped directory and
kept as long (``workdir_retention_s`` after its last upload, submit, or use by the leader, which
keeps those of the jobs it sizes). Parsed once per digest: the bytes never change.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from fleet.errors import SpecError
from fleet.keys import Keys
from fleet.models import LEARN, PROFILES, JobSpec, Range, uploaded_profile
from fleet.scheduler.learned import LearnedProfile
from fleet.scheduler.profiles import Profile, from_data, named_profile
from fleet.state.blobs import BlobStore
from fleet.state.connection import translated
from fleet.workdir import check_digest

#: parsed profiles kept in memory (each a few hundred KB at most)
CACHED = 64


class ProfileStore:
    def __init__(self, redis: Any, keys: Keys, ttl_s: float) -> None:
        self.blobs = BlobStore(redis, keys, ttl_s)
        self._parsed: OrderedDict[str, Profile] = OrderedDict()
        #: (profile name or digest, a job's max_batch_per_gpu) -> that profile so capped
        self._capped_copies: dict[tuple[str, int], Profile] = {}

    def profile_of(
        self, spec: JobSpec, measured: Mapping[tuple[int, int], float] | None = None, touch: bool = False
    ) -> Profile:
        """An elastic job's profile: bundled, uploaded, or learned from ``measured`` (``Job.measured``).
        :class:`SpecError` when an uploaded one is not stored or not a profile. ``touch``: check that
        an uploaded one is still stored and keep it another ``ttl_s`` (a submit; the leader, which
        sizes jobs often, keeps those in use once per resync instead)."""
        name = spec.profile or ""
        if name == LEARN:
            return learned(spec, measured or {})
        if name in PROFILES:
            return self._capped(name, named_profile(name), spec.max_batch_per_gpu)
        if uploaded_profile(name):
            return self._capped(name, self.load(name, touch), spec.max_batch_per_gpu)
        raise SpecError(
            f"profile {name[:80]!r}: a local directory; the CLI and Client upload it and send "
            "its sha256:<hex> (PUT /v1/blobs/DIGEST with its JSON, as they do)"
        )

    def load(self, digest: str, touch: bool = False) -> Profile:
        """The profile uploaded as ``digest``, parsed once; :class:`SpecError` when it is not stored, or
        not a profile. Read from Redis the first time (and kept another ``ttl_s``), or with ``touch``."""
        found = self._parsed.get(digest)
        if found is not None and (not touch or self.blobs.touch(digest)):
            self._parsed.move_to_end(digest)
            return found
        data = self.blobs.get(digest)
        if data is None:
            raise SpecError(not_uploaded(digest))
        try:
            profile = from_data(json.loads(data))
        except ValueError as exc:  # a JSONDecodeError is one
            raise SpecError(f"profile {digest}: not a scaling profile: {exc}") from None
        self.blobs.touch(digest)
        self._parsed[digest] = profile
        while len(self._parsed) > CACHED:
            self._parsed.popitem(last=False)
        return profile

    def _capped(self, name: str, profile: Profile, most: int | None) -> Profile:
        """``profile`` (bundled ``name`` or uploaded digest: the same content whenever it is parsed)
        giving a GPU at most ``most`` samples per step; one copy per cap, so what it worked out is kept."""
        if most is None or (profile.max_local is not None and profile.max_local <= most):
            return profile
        found = self._capped_copies.get((name, most))
        if found is None:
            if len(self._capped_copies) >= CACHED:
                self._capped_copies.clear()
            found = self._capped_copies[name, most] = replace(profile, max_local=most)
        return found

    @translated
    def keep(self, digests: Iterable[str]) -> None:
        """Keep these another ``ttl_s`` (those of the jobs the leader sizes), in one round trip."""
        pipe = self.blobs.redis.pipeline(transaction=False)
        for digest in set(digests):
            pipe.pexpire(self.blobs.keys.blob(check_digest(digest)), self.blobs.ttl_ms)
        pipe.execute()


def not_uploaded(digest: str) -> str:
    """Why a profile named by its digest cannot be used: not stored, or not the tenant's upload (the
    same words, so that the answer tells nothing of other tenants' uploads)."""
    why = "give the directory (--profile ./DIR, or profile='./DIR' to Client.submit): they upload it"
    return f"profile {digest}: not uploaded (or expired); {why}"


def learned(spec: JobSpec, measured: Mapping[tuple[int, int], float]) -> LearnedProfile:
    """The profile of a job with ``profile: learn``, from what it reported at each size."""
    assert isinstance(spec.gpus, Range) and spec.batch_range is not None
    low, high = spec.batch_range
    return LearnedProfile(
        name=LEARN,
        min_batch=low,
        max_batch=high,
        least=max(spec.gpus.min, 1),
        max_local=spec.max_batch_per_gpu,
        observed=measured,
    )
