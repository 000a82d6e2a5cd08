"""Tenants (a team's share of the fleet) and identities (who a token is, what its role allows)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fleet.errors import SpecError
from fleet.models.base import _LAZY, _NAME, Size, _UserModel, describe_errors
from fleet.models.parts import Webhook, _webhook


class Role(StrEnum):
    """What a token may do. Each role can do everything the ones before it can."""

    #: submit, read and cancel the jobs of its own tenant; read nodes
    USER = "user"
    #: also cordon, uncordon and drain nodes, and read and cancel every tenant's jobs
    OPERATOR = "operator"
    #: also manage tenants and tokens, and submit for any tenant
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        order = list(Role)
        return order.index(self) >= order.index(needed)


class Identity(BaseModel):
    """Who made an API call: from the bearer token the API checked."""

    user: str
    tenant: str
    role: Role
    token_id: str = ""


class TokenInfo(BaseModel):
    """A token's record (never the token itself: only its hash is kept)."""

    id: str
    user: str = Field(pattern=_NAME, description="1-63 letters, digits, '_', '.', '-'")
    tenant: str = Field(pattern=_NAME, description="1-63 letters, digits, '_', '.', '-'")
    role: Role
    created_at: float
    expires_at: float | None = None
    created_by: str = ""


#: a tenant's name becomes a Redis hash field and a metrics label: the rule of job names
TENANT_NAME = _NAME
_ALLOWED_USER = r"\d{1,10}:\d{1,10}\Z"
_MAX_ID = 2**32 - 2


def normal_user(text: str) -> str:
    """``"uid[:gid]"`` as ``"uid:gid"`` without leading zeros (the gid the uid's number when not given)."""
    uid, _, gid = text.partition(":")
    return f"{int(uid)}:{int(gid or uid)}"


class Tenant(_UserModel):
    """A team's share of the fleet. A tenant with no record gets ``Tenant(name=...)``: no guarantee,
    no limit, weight 1, so nobody is starved by forgetting to configure a team."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = Field(pattern=_NAME, description="1-63 letters, digits, '_', '.', '-'")
    #: GPUs the tenant gets first whenever it has work, preempting tenants above their fair share
    guaranteed_gpus: int = Field(default=0, ge=0, le=1_000_000)
    #: CPUs and memory it gets first: a tenant below any of its guarantees is served before those at
    #: theirs. Only a GPU guarantee preempts (fair shares of CPUs and memory are not tracked)
    guaranteed_cpus: float = Field(default=0.0, ge=0, le=10_000_000)
    guaranteed_memory: Size = None
    #: the most GPUs its jobs hold at once; None: no limit
    max_gpus: int | None = Field(default=None, ge=0, le=1_000_000)
    #: the most CPUs and memory its jobs hold at once (scheduled resources, as GPUs); None: no limit
    max_cpus: float | None = Field(default=None, ge=0, le=10_000_000)
    max_memory: Size = None
    #: its part of the capacity beyond the guarantees, relative to the other tenants' weights
    weight: float = Field(default=1.0, gt=0, le=1_000_000)
    #: seconds its jobs get between SIGTERM and SIGKILL when preempted, to checkpoint
    preempt_grace_s: float = Field(default=120.0, ge=0, le=86_400)
    #: seconds a job of this tenant runs before it may be preempted (so it checkpoints at least once)
    min_run_s: float = Field(default=600.0, ge=0, le=30 * 86_400)
    #: bytes of its jobs' kept outputs (``fleet download``) on the checkpoint storage at once; None:
    #: the fleet's ``outputs_quota_bytes``
    outputs_quota: Size = None
    #: POSTed to when any of its jobs ends (a URL, or {url, format}); shown only to the tenant and admins
    webhook: Annotated[Webhook | None, BeforeValidator(_webhook)] = None
    #: the webhook hears node state changes too (READY, CORDONED, DRAINING, DRAINED, DOWN, removed)
    webhook_nodes: bool = False
    #: host users ("uid:gid") its jobs may name as their spec's ``user``; a job that names none runs
    #: as the tenant's own uid (agent.job_uid_range). Never gid 0; uid 0 only where allow_root_jobs
    allowed_users: list[Annotated[str, Field(max_length=21)]] = Field(
        default_factory=list, max_length=64, description='"uid:gid" (both numbers, gid not 0)'
    )

    @field_validator("allowed_users")
    @classmethod
    def _host_users(cls, users: list[str]) -> list[str]:
        if bad := [
            u for u in users if not re.match(_ALLOWED_USER, u) or max(map(int, u.split(":"))) > _MAX_ID
        ]:
            raise ValueError(f'{bad[0]!r}: expected "uid:gid", two numbers up to {_MAX_ID}, e.g. "1000:1000"')
        found = {normal_user(u) for u in users}
        if root := sorted(u for u in found if u.endswith(":0")):
            raise ValueError(f"{root[0]}: gid 0 is root's group and never allowed; give the user's own group")
        return sorted(found, key=lambda u: tuple(int(n) for n in u.split(":")))

    @model_validator(mode="after")
    def _guarantee_within_max(self) -> Tenant:
        for kind, noun, fmt, guaranteed, most in (
            ("gpus", "GPUs", "d", self.guaranteed_gpus, self.max_gpus),
            ("cpus", "CPUs", "g", self.guaranteed_cpus, self.max_cpus),
            ("memory", "memory", "d", self.guaranteed_memory or 0, self.max_memory),
        ):
            if most is not None and guaranteed > most:
                raise ValueError(
                    f"guaranteed_{kind} ({guaranteed:{fmt}}) is above max_{kind} ({most:{fmt}}): "
                    f"a tenant cannot be guaranteed {noun} it may not use"
                )
        return self

    def check_user(self, requested: str) -> tuple[int, int]:
        """(uid, gid) of a job spec's ``user`` when this tenant's ``allowed_users`` holds it;
        :class:`SpecError` naming the field and the fix otherwise (gid 0 never)."""
        user = normal_user(requested)
        uid, gid = (int(n) for n in user.split(":"))
        own = f"drop `user` (its jobs then run as tenant {self.name}'s own uid)"
        if gid == 0:
            raise SpecError(f"user {requested!r}: gid 0 is root's group and never allowed; {own}")
        if user not in self.allowed_users:
            raise SpecError(
                f"user {requested!r}: tenant {self.name}'s jobs may not run as host user {user}; {own}, or "
                f"ask an admin to allow it for the tenant: `fleet tenant set {self.name} --allow-user {user}`"
            )
        return uid, gid

    @property
    def guaranteed(self) -> bool:
        """Whether any resource is guaranteed."""
        return bool(self.guaranteed_gpus or self.guaranteed_cpus or self.guaranteed_memory)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Tenant:
        """Validate ``data``; raise :class:`SpecError` naming each bad field and what is allowed."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(describe_errors(exc, cls, "tenant")) from None


class TenantStatus(BaseModel):
    """A tenant's policy and where it stands, as the leader last published it (``as_of``)."""

    model_config = _LAZY

    tenant: Tenant
    #: False: no record, the default policy applies
    configured: bool = True
    gpus_used: int = 0
    jobs_running: int = 0
    jobs_pending: int = 0
    #: the GPUs weighted fair share gives it now, given every tenant's demand (guarantee first, at
    #: most its max and its demand)
    fair_share_gpus: float = 0.0
    #: GPU-seconds used, each second's weight halving every ``controller.fair_share_half_life_s``
    usage_gpu_s: float = 0.0
    as_of: float = 0.0


class WebhookOutcome(BaseModel):
    """How one attempt at a webhook delivery went (``Client.webhook_deliveries()``)."""

    model_config = _LAZY

    at: float
    #: the delivery's id (its ``X-Fleet-Delivery`` header, the same on every retry)
    delivery: str
    tenant: str
    #: job.ended or node.changed, and the job id or node name it is about
    event: str
    subject: str
    #: the receiver's scheme and host only (a Slack webhook URL's path is its secret)
    url: str
    #: delivered (answered 2xx), retrying (will be tried again) or failed (attempts spent)
    status: Literal["delivered", "retrying", "failed"]
    attempt: int
    #: the HTTP status it answered, None when it did not (refused, timed out)
    code: int | None = None
    error: str = ""
    #: when the next attempt is due (retrying)
    next_at: float | None = None
