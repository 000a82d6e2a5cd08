"""Tenants in Redis: the operators' policies, the decayed usage fair share reads, and the status
the leader publishes for the API and CLI.

The policies are records an operator writes (``set``/``delete``, one hash field each, no script
needed). Usage and status are the leader's: it folds what runs into the usage and publishes every
tenant's standing in one fenced script (``tenant_usage.lua``), so readers (``status``) cost one
round trip and never scan the jobs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

import redis
from pydantic import ValidationError

from fleet.errors import NotFound, NotLeader, SpecError
from fleet.keys import Keys
from fleet.models import Tenant, TenantStatus
from fleet.scheduler.usage import accrue
from fleet.state.connection import load_scripts, translated
from fleet.state.replication import replicated

#: the tenant every fleet has, created by nobody
DEFAULT_TENANT = "default"
#: the hash field holding when usage was folded / status published (tenant names start alnum)
AT = "@at"


@dataclass(frozen=True)
class Usage:
    """Decayed GPU-seconds per tenant as of ``at`` (0: never folded)."""

    at: float
    gpu_seconds: dict[str, float]


class TenantStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = keys
        self._scripts = load_scripts(client)

    # -- policies ---------------------------------------------------------------------

    @translated
    def set(self, tenant: Tenant) -> None:
        """Create or replace ``tenant``'s policy; the leader applies it within
        ``controller.usage_interval_s``."""
        self.redis.hset(self.keys.tenants, tenant.name, tenant.model_dump_json())
        replicated(self.redis, self.keys, f"the policy of tenant {tenant.name}")

    @translated
    def get(self, name: str) -> Tenant:
        """The stored policy; :class:`NotFound` when there is none (its jobs get ``policy(name)``)."""
        raw = self.redis.hget(self.keys.tenants, name)
        tenant = _parse(name, raw) if raw is not None else None
        if tenant is None:
            raise NotFound(
                f"no tenant {name!r} (its jobs get the default policy; list tenants with `fleet tenants`)"
            )
        return tenant

    @translated
    def names(self) -> list[str]:
        """The tenants an admin created (``fleet tenant set``), by name."""
        return sorted(self.redis.hkeys(self.keys.tenants))

    def check(self, name: str) -> None:
        """:class:`SpecError` for a tenant named where one must exist (an admin's ``--tenant`` at
        submit, a new token's tenant) that was never created: a misspelt name would otherwise start
        a tenant of its own. ``default`` always exists."""
        if name == DEFAULT_TENANT:
            return
        known = self.names()
        if name not in known:
            near = get_close_matches(name, known, n=1)
            raise SpecError(
                f"tenant: no tenant {name!r}{f' (did you mean {near[0]!r}?)' if near else ''}; tenants: "
                f"{', '.join([DEFAULT_TENANT, *known])}; an admin creates one with `fleet tenant set {name}`"
            )

    def policy(self, name: str) -> Tenant:
        """What applies to ``name``'s jobs: its record, or the default policy."""
        try:
            return self.get(name)
        except NotFound:
            return Tenant(name=name)

    @translated
    def delete(self, name: str) -> bool:
        """Forget ``name``'s policy (its jobs get the default one); False when it had none."""
        deleted = bool(self.redis.hdel(self.keys.tenants, name))
        replicated(self.redis, self.keys, f"the deletion of tenant {name}")
        return deleted

    @translated
    def all(self) -> list[Tenant]:
        """Every stored policy that can be read, by name."""
        raw = self.redis.hgetall(self.keys.tenants)
        found = (_parse(name, text) for name, text in sorted(raw.items()))
        return [t for t in found if t is not None]

    # -- usage and status (the leader's) ------------------------------------------------

    def usage(self) -> Usage:
        return self._usage()[1]

    @translated
    def _usage(self) -> tuple[str, Usage]:
        """The usage, and its @at field exactly as stored ('' for none: what the fold compares)."""
        raw = self.redis.hgetall(self.keys.tenant_usage)
        at = raw.pop(AT, "")
        return at, Usage(float(at or 0), {name: float(v) for name, v in raw.items()})

    @translated
    def fold(
        self,
        allocated: Mapping[str, float],
        now: float,
        half_life: float,
        leader: str,
        status: Sequence[TenantStatus] = (),
    ) -> Usage:
        """Add what ran since the last fold (each tenant holding ``allocated`` GPUs meanwhile) to the
        decayed usage, and publish ``status`` (usage filled in) with it; the usage now. A fold that
        raced another (a previous leader's, finishing late) reads again and retries."""
        for _ in range(3):
            read_at, before = self._usage()
            after = accrue(before.gpu_seconds, allocated, now - before.at if before.at else 0.0, half_life)
            at = max(now, before.at)  # a leader whose clock runs behind never moves the fold back
            published = {
                s.tenant.name: s.model_copy(
                    update={"usage_gpu_s": after.get(s.tenant.name, 0.0), "as_of": at}
                )
                for s in status
            }
            code = self._scripts["tenant_usage"](
                keys=[self.keys.leader, self.keys.tenant_usage, self.keys.tenant_status],
                args=[
                    leader,
                    read_at,
                    json.dumps({AT: repr(at), **{t: repr(v) for t, v in after.items()}}),
                    json.dumps({AT: repr(at), **{t: s.model_dump_json() for t, s in published.items()}}),
                ],
            )
            if code == -2:
                raise NotLeader("usage fold refused: another controller holds the leader lease")
            if code == 1:
                return Usage(at, after)
        return self.usage()

    @translated
    def status(self) -> list[TenantStatus]:
        """Every tenant with a policy or with jobs, by name: its current policy, its queued jobs now,
        and its use as the leader last published it (at most ``controller.usage_interval_s`` old;
        zeros for a tenant configured since, or when no leader ran)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.tenants)
        pipe.hgetall(self.keys.tenant_status)
        pipe.hgetall(self.keys.tenant_usage)
        pipe.smembers(self.keys.queued_tenants)
        policies, published, usage, queuing = pipe.execute()
        at = float(published.pop(AT, 0) or 0)
        usage.pop(AT, None)
        queued = self._queued(sorted(queuing))
        out = []
        for name in sorted(set(policies) | set(published) | set(queued)):
            tenant = _parse(name, policies[name]) if name in policies else None
            try:
                current = TenantStatus.model_validate_json(published[name]) if name in published else None
            except ValidationError:
                current = None
            base = current or TenantStatus(
                tenant=tenant or Tenant(name=name), as_of=at, usage_gpu_s=float(usage.get(name, 0) or 0)
            )
            now = {"tenant": tenant or Tenant(name=name), "configured": tenant is not None}
            out.append(base.model_copy(update={**now, "jobs_pending": queued.get(name, 0)}))
        return out

    def _queued(self, tenants: list[str]) -> dict[str, int]:
        """Each tenant's QUEUED jobs (array tasks among them) as the queue's index holds them now: a
        count the leader's published status would give up to a usage interval late."""
        pipe = self.redis.pipeline(transaction=False)
        for name in tenants:
            pipe.zcard(self.keys.queued_in(name))
        return {name: int(n) for name, n in zip(tenants, pipe.execute(), strict=True) if n}

    # -- metrics ----------------------------------------------------------------------

    @translated
    def count_preemption(self, tenant: str) -> None:
        self.redis.hincrby(self.keys.preemptions, tenant, 1)

    @translated
    def preemption_counts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.redis.hgetall(self.keys.preemptions).items()}


def _parse(name: str, text: str) -> Tenant | None:
    """A stored policy, or None when it cannot be read (its jobs get the default policy)."""
    try:
        tenant = Tenant.model_validate_json(text)
    except ValidationError:
        return None
    return tenant if tenant.name == name else tenant.model_copy(update={"name": name})
