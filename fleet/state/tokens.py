"""API tokens: who a bearer token is (user, tenant, role), stored hashed, revocable, expiring.

A token reads ``fleet_<id>_<secret>``: the id names its record (so a check is one read, and an
admin can list and revoke tokens without ever seeing one again), the secret is 32 random bytes
of which only the SHA-256 is stored. A stolen Redis dump therefore holds no usable token. The
secret is random, not a password, so one unsalted hash is enough (nothing to brute-force).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from typing import Any

from pydantic import ValidationError

from fleet.errors import SpecError
from fleet.keys import Keys
from fleet.models import Identity, Role, TokenInfo, describe_errors
from fleet.state.connection import translated
from fleet.state.replication import replicated

_TOKEN = re.compile(r"^fleet_([0-9a-f]{12})_([A-Za-z0-9_-]{43})\Z")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore:
    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    @translated
    def create(
        self,
        user: str,
        tenant: str,
        role: Role,
        *,
        expires_in_s: float | None = None,
        created_by: str = "",
        now: float | None = None,
    ) -> tuple[str, TokenInfo]:
        """A new token (shown once: only its hash is kept) and its record."""
        now = time.time() if now is None else now
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        try:
            info = TokenInfo(
                id=token_id,
                user=user,
                tenant=tenant,
                role=role,
                created_at=now,
                expires_at=None if expires_in_s is None else now + expires_in_s,
                created_by=created_by,
            )
        except ValidationError as exc:
            raise SpecError(f"token: {describe_errors(exc)}") from None
        record = {"sha256": _digest(secret), "info": info.model_dump_json()}
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.token(token_id), mapping=record)
        if info.expires_at is not None:
            pipe.pexpireat(self.keys.token(token_id), int(info.expires_at * 1000))
        pipe.sadd(self.keys.tokens, token_id)
        pipe.execute()
        replicated(self.redis, self.keys, f"token {token_id}")
        return f"fleet_{token_id}_{secret}", info

    @translated
    def identify(self, token: str, now: float | None = None) -> Identity | None:
        """Who ``token`` is; None when it is malformed, unknown, revoked or expired."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        token_id, secret = match.groups()
        digest, raw = self.redis.hmget(self.keys.token(token_id), "sha256", "info")
        if digest is None or raw is None:
            return None
        if not hmac.compare_digest(_str(digest), _digest(secret)):
            return None
        info = TokenInfo.model_validate_json(raw)
        if info.expires_at is not None and info.expires_at <= (time.time() if now is None else now):
            return None
        return Identity(user=info.user, tenant=info.tenant, role=info.role, token_id=info.id)

    @translated
    def all(self) -> list[TokenInfo]:
        """Every token not revoked or expired, oldest first (an expired one's id is dropped here)."""
        ids = sorted(_str(i) for i in self.redis.smembers(self.keys.tokens))
        pipe = self.redis.pipeline(transaction=False)
        for token_id in ids:
            pipe.hget(self.keys.token(token_id), "info")
        found, gone = [], []
        for token_id, raw in zip(ids, pipe.execute(), strict=True):
            if raw is None:
                gone.append(token_id)
            else:
                found.append(TokenInfo.model_validate_json(raw))
        if gone:
            self.redis.srem(self.keys.tokens, *gone)
        return sorted(found, key=lambda t: t.created_at)

    @translated
    def revoke(self, token_id: str) -> bool:
        """False when there was no such token."""
        pipe = self.redis.pipeline()
        pipe.delete(self.keys.token(token_id))
        pipe.srem(self.keys.tokens, token_id)
        deleted, _ = pipe.execute()
        replicated(self.redis, self.keys, f"the revocation of token {token_id}")
        return bool(deleted)


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
