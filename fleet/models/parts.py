"""The parts of a job spec a tenant's settings share (host mounts and webhooks), what fleet
records of a shipped directory, and a function's call."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from fleet.models.base import _DIGEST, Text, _UserModel


class Mount(_UserModel):
    """A host directory bind-mounted into the job; allowed only under the operator's allow-list."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    source: Text = Field(max_length=4096, description="absolute host path")
    target: Text = Field(max_length=4096, description="absolute path in the container")
    read_only: bool = True

    @field_validator("source", "target")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "/../" in f"{value}/":
            raise ValueError("must be an absolute path without '..'")
        return value


class WorkdirSize(_UserModel):
    """What a shipped directory holds, as the API found it when it was uploaded (``fleet show``
    tells it without asking for the blob, which would keep it longer)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    #: the archive's bytes
    packed: int = Field(ge=0)
    #: the bytes of its files, unpacked
    bytes: int = Field(ge=0)
    #: its files and links
    files: int = Field(ge=0)


#: most jobs one job may wait for, an array's tasks counted one by one (the stored spec lists each)
AFTER_MAX = 10_000
#: a job's id, as an entry of ``after`` or a call's ``inputs`` names one
_JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


class FunctionCall(_UserModel):
    """A function job's call (``fleet.function``): its function and arguments, pickled by the caller
    into an uploaded blob the node hands the job; the rest is what ``fleet show`` tells of it."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    blob: str = Field(pattern=_DIGEST, description="sha256:<hex> of the uploaded call")
    #: ``module.qualname`` of the function
    function: Text = Field(max_length=512)
    #: the arguments, summarised by the caller (reprs cut short)
    args: Text = Field(default="", max_length=1024)
    #: the jobs whose results are among the arguments (``g.submit(f.submit(x))``): each must be in
    #: ``after`` (when ``ok``), and the node hands the job their outcomes beside its call
    inputs: list[Annotated[str, Field(pattern=_JOB_ID)]] = Field(default_factory=list, max_length=AFTER_MAX)


#: the longest webhook URL accepted (a Slack incoming webhook's is about 80 characters)
WEBHOOK_URL_MAX = 2048


class Webhook(_UserModel):
    """Where fleet POSTs what happened (a job's end, a node's state): JSON signed with the tenant's
    secret (``X-Fleet-Signature-256``), or ``format="slack"``: the ``{"text": ...}`` a Slack incoming
    webhook takes. A bare URL string is read as ``Webhook(url=...)``."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    url: str = Field(max_length=WEBHOOK_URL_MAX, description="http:// or https:// URL")
    format: Literal["json", "slack"] = "json"

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"{value[:100]!r} is not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
            raise ValueError(f"{value[:100]!r}: expected an http:// or https:// URL with a host")
        return value


def _webhook(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value


#: Slurm's afterok / afterany / afternotok: the job runs once its dependency SUCCEEDED, ended in
#: any way, or ended without succeeding
When = Literal["ok", "any", "notok"]


class Dependency(_UserModel):
    """A job this one waits for (``after``): ``{job, when}``, or ``"JOB[:ok|:any|:notok]"``."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    job: str = Field(pattern=_JOB_ID, description="a job or array id")
    when: When = "ok"


def _dependency(value: Any) -> Any:
    """``"JOB:when"`` (a CLI flag, a YAML spec) as ``{job, when}``; a handle or job as its id."""
    value = getattr(value, "job_id", None) or getattr(value, "id", None) or value
    if isinstance(value, str):
        job, _, when = value.partition(":")
        return {"job": job, "when": when or "ok"}
    return value
