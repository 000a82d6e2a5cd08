"""The shapes fleet stores and passes around: job specs, jobs, nodes and GPUs."""

from __future__ import annotations

import re
from difflib import get_close_matches
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleet.errors import SpecError

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: a job id becomes a Redis key and a directory name: no ':', no '/', never '.' or '..'
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$"
#: numeric uid[:gid]: names resolve differently on the host and in each image
_USER = r"^\d{1,10}(:\d{1,10})?$"
#: a Docker image reference: [registry[:port]/]path[:tag][@digest], lower-case path
_IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}$"
#: every model builds its validators on first use, not at import: a CLI command pays for the ones it uses
_LAZY = ConfigDict(defer_build=True)
#: bytes a spec's command, env or labels may hold in total (the record lives in Redis)
SPEC_BYTES_MAX = 128 << 10
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object) -> int | None:
    """Bytes from an int or a string like ``512m``, ``8g``, ``16GiB`` (binary units, as Docker)."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size: use bytes or a number with k, m, g or t (e.g. 8g)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


Size = Annotated[Annotated[int, Field(ge=1)] | None, BeforeValidator(parse_size)]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d|days?)?\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: object) -> float | None:
    """Seconds from a number or a string like ``90``, ``90s``, ``30m``, ``30min``, ``2h``, ``1d``."""
    if value is None or isinstance(value, int | float):
        return value
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration: use seconds or a number with s, m, h or d (e.g. 2h)")
    number, unit = match.groups()
    return float(number) * _SECONDS[(unit or "s")[0].lower()]


Duration = Annotated[Annotated[float, Field(gt=0, le=366 * 86400)] | None, BeforeValidator(parse_duration)]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    return value


#: free text a user sends: bounded and NUL-free (it becomes argv, env or a label)
Text = Annotated[str, Field(max_length=32 << 10), AfterValidator(_no_nul)]


def check_job_id(job_id: str) -> str:
    """``job_id`` if valid, else :class:`SpecError` naming the rule: ids become keys and paths."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise SpecError(
            f"job id {_clip(repr(job_id))} is invalid: use 1-128 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return job_id


class JobState(StrEnum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def on_node(self) -> bool:
        return self in ON_NODE_STATES

    @classmethod
    def parse(cls, state: JobState | str | None) -> JobState | None:
        """``state`` in any case (None or '' for any state); :class:`SpecError` naming the states."""
        if state is None or state == "":
            return None
        try:
            return cls(str(state).upper())
        except ValueError:
            raise SpecError(f"state {state!r}: expected one of {', '.join(s.value for s in cls)}") from None


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: states in which a job is bound to a node and holds GPU claims
ON_NODE_STATES = (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING)


if TYPE_CHECKING:  # mypy keeps the pydantic plugin's typed constructor signatures
    _UserModel = BaseModel
else:

    class _Checked(type(BaseModel)):
        """Direct construction (``JobSpec(name=..., gpu=1)``) raises :class:`SpecError` naming the field
        and the fix, as :meth:`JobSpec.parse` does, never pydantic's raw ``ValidationError`` (both are
        ``ValueError``: ``except ValueError`` still works). A metaclass, not ``__init__``: pydantic
        calls a custom ``__init__`` for every nested model it validates (each stored job's spec)."""

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().__call__(*args, **kwargs)
            except ValidationError as exc:
                what = "job spec" if cls.__name__ == "JobSpec" else cls.__name__.lower()
                raise SpecError(describe_errors(exc, cls, what)) from None

    class _UserModel(BaseModel, metaclass=_Checked):
        pass


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


class Range(BaseModel):
    """An elastic job's range: ``{min, max}`` (or ``"min-max"``), both included."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    def __str__(self) -> str:
        return f"{self.min}-{self.max}"


_RANGE_TEXT = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
#: the tags that tell a count from a range: left out of the field names errors print
_TAGS = ("count", "range")


def _range_text(value: object) -> object:
    """``"1-4"`` (a YAML spec, a CLI flag) as ``{min: 1, max: 4}``; anything else as it is."""
    match = _RANGE_TEXT.match(value) if isinstance(value, str) else None
    return {"min": int(match[1]), "max": int(match[2])} if match else value


def _count_or_range(value: object) -> str:
    return "range" if isinstance(value, dict | Range) else "count"


#: a number, or ``{min, max}`` (``"min-max"``): an elastic job's GPUs or batch size
GpuCount = Annotated[
    Annotated[Annotated[int, Field(ge=0, le=1024)], Tag("count")] | Annotated[Range, Tag("range")],
    Discriminator(_count_or_range), BeforeValidator(_range_text),
]  # fmt: skip
BatchSize = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=1 << 24)], Tag("count")] | Annotated[Range, Tag("range")],
    Discriminator(_count_or_range), BeforeValidator(_range_text),
]  # fmt: skip
#: the scaling profiles fleet ships (measured throughput of real models; see fleet sim)
PROFILES = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
#: an elastic job's profile learned from its own reports (``fleet_worker.report``)
LEARN = "learn"
_PROFILE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PROFILE_KINDS = (
    f"one fleet ships ({', '.join(PROFILES)}), '{LEARN}' (from the job's fw.report calls), or a directory "
    "in the profiles format ('./dir': the CLI and Client upload it)"
)


#: validation context of records fleet wrote itself (``Job.model_validate(data, context={FROM_FLEET: True})``)
FROM_FLEET = "from_fleet"


#: the least memory a job may ask for (Docker refuses less); a bare "16" is 16 bytes, a typo
MEMORY_MIN = 6 << 20


def uploaded_profile(profile: str) -> bool:
    """``profile`` names an uploaded one (``sha256:<hex>`` of its data)."""
    return _PROFILE_DIGEST.fullmatch(profile) is not None


class JobSpec(_UserModel):
    """What a user asks to run. Unknown fields are rejected so typos never pass silently."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = Field(pattern=_NAME, description="1-63 letters, digits, '_', '.', '-'")
    command: list[Text] = Field(min_length=1, max_length=4096)
    image: str | None = Field(
        default=None, pattern=_IMAGE, description="an image reference, e.g. repo/name:tag"
    )
    env: dict[Annotated[str, Field(max_length=256)], Text] = Field(default_factory=dict, max_length=1024)
    user: str | None = Field(
        default=None, pattern=_USER, description="uid[:gid] the job runs as (default: the node's job_user)"
    )
    #: GPUs of the whole job (all its nodes); ``{min, max}`` makes it elastic: fleet chooses its size in
    #: that range, and changes it while it runs (checkpoint, then a new attempt at the new size)
    gpus: GpuCount = Field(default=0, description="GPUs of the whole job, or {min, max} (elastic)")
    #: a multi-node job: how many nodes (one member each) and GPUs per node, when the user pins them;
    #: unset, a job larger than any node is split by the scheduler (fleet.scheduler.capacity.split)
    nodes: int | None = Field(default=None, ge=1, le=64)
    gpus_per_node: int | None = Field(default=None, ge=1, le=64)
    cpus: float | None = Field(default=None, gt=0, le=1024)
    memory: Size = None
    shm_size: Size = None
    gpu_model: Text | None = Field(
        default=None, min_length=1, max_length=128, description="substring of the GPU model name"
    )
    min_gpu_memory: Size = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    max_attempts: int = Field(default=3, ge=1, le=100)
    labels: dict[Annotated[str, Field(pattern=_LABEL_KEY)], Annotated[Text, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=64
    )
    tenant: str = Field(default="default", pattern=_NAME)
    #: False: a job of a tenant within its guarantee is never stopped to make room for another
    #: (a tenant above its guarantee cannot shield its jobs with it)
    preemptible: bool = True
    #: wall-clock limit of each attempt: past it the attempt is stopped and the job ends FAILED
    #: ("time limit"), or goes back to the queue with ``requeue_on_timeout`` (a checkpointing run)
    timeout: Duration = None
    #: SIGTERM this long before the limit, SIGKILL at it (time to checkpoint, as Slurm's --signal)
    signal_before: Duration = None
    requeue_on_timeout: bool = False
    #: a directory shipped with the job, its working directory: a local path for the Client and
    #: CLI (``--workdir .``), which upload it and send ``sha256:<hex>`` of its packed bytes
    workdir: str | None = Field(default=None, max_length=4096)
    mounts: list[Mount] = Field(default_factory=list, max_length=32)
    #: POSTed to when the job ends (SUCCEEDED, FAILED, CANCELLED): a URL, or {url, format}
    notify: Annotated[Webhook | None, BeforeValidator(_webhook)] = None
    #: the global batch size (``FLEET_BATCH_SIZE``); for an elastic job ``{min, max}`` lets fleet choose
    #: it with the GPUs, one value keeps it at every size
    batch_size: BatchSize | None = Field(default=None, description="global batch size, or {min, max}")
    #: how an elastic job's throughput grows with GPUs and batch size: a profile fleet ships (PROFILES),
    #: ``learn`` (from the job's own reports), or one uploaded in the profiles format: a local directory
    #: for the Client and CLI (``--profile ./dir``), which upload it and send ``sha256:<hex>``
    profile: str | None = Field(default=None, max_length=4096)

    @property
    def elastic(self) -> bool:
        """Sized by fleet within a range of GPUs (see ``gpus``)."""
        return isinstance(self.gpus, Range)

    @property
    def min_gpus(self) -> int:
        return self.gpus.min if isinstance(self.gpus, Range) else self.gpus

    @property
    def max_gpus(self) -> int:
        return self.gpus.max if isinstance(self.gpus, Range) else self.gpus

    @property
    def batch_range(self) -> tuple[int, int] | None:
        """The global batch sizes allowed (one value: low == high), or None without a batch size."""
        batch = self.batch_size
        return (
            None if batch is None else (batch.min, batch.max) if isinstance(batch, Range) else (batch, batch)
        )

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the program (first element) must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not a valid variable name (letters, digits, '_')")
            if key.startswith("FLEET_"):
                raise ValueError(f"{key!r}: FLEET_* variables are set by fleet itself")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if info.context and info.context.get(FROM_FLEET):
            return value  # a job fleet already stored, read back (an array task carries fleet.* labels)
        for key in value:
            if key.startswith("fleet."):
                raise ValueError(f"{key!r}: fleet.* labels are set by fleet itself (array tasks carry them)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        """``nodes`` x ``gpus_per_node`` is the job's ``gpus``: given both, ``gpus`` may be left out;
        given one, it must divide ``gpus``."""
        if not isinstance(data, dict):
            return data
        nodes, per_node, gpus = data.get("nodes"), data.get("gpus_per_node"), data.get("gpus")
        if not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (nodes, per_node) if v is not None
        ):
            return data  # the field validators name what is wrong
        if isinstance(gpus, bool) or (gpus is not None and not isinstance(gpus, int)):
            return data
        if nodes and per_node:
            if gpus not in (None, 0, nodes * per_node):
                raise ValueError(
                    f"gpus: {gpus} is not nodes x gpus_per_node = {nodes * per_node}; give two of the three"
                )
            return {**data, "gpus": nodes * per_node}
        if per_node and not gpus:
            raise ValueError("gpus_per_node: give gpus (the job's total) or nodes as well")
        for name, share in (("nodes", nodes), ("gpus_per_node", per_node)):
            if share and gpus and gpus % share:
                raise ValueError(
                    f"{name}: {gpus} GPUs do not split evenly into {share}; make gpus a multiple of it"
                )
        return data

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: int | None) -> int | None:
        if value is not None and value < MEMORY_MIN:
            raise ValueError(f"{value} bytes is less than a job can run in (6 MiB): give a unit, e.g. 16g")
        return value

    @model_validator(mode="after")
    def _time_limit(self) -> JobSpec:
        if self.signal_before is not None and (self.timeout is None or self.signal_before >= self.timeout):
            raise ValueError(
                "signal_before: it must be shorter than timeout (SIGTERM comes that long before it)"
            )
        return self

    @model_validator(mode="after")
    def _elastic(self) -> JobSpec:
        """An elastic job: a range of GPUs, a batch size and a profile, and nothing that pins its shape."""
        if not self.elastic:
            if isinstance(self.batch_size, Range):
                raise ValueError("batch_size: a range of batch sizes needs a range of GPUs too (gpus: "
                                 "{min, max}); a job of fixed size takes one batch size")  # fmt: skip
            if self.profile is not None:
                raise ValueError("profile: only an elastic job (gpus: {min, max}) uses a scaling profile")
            return self
        for pinned in ("nodes", "gpus_per_node"):
            if getattr(self, pinned) is not None:
                raise ValueError(f"{pinned}: an elastic job's size is fleet's to choose; drop {pinned} (a "
                                 "size larger than a node runs on several, one member each)")  # fmt: skip
        if self.batch_size is None:
            raise ValueError("batch_size: an elastic job needs its global batch size: {min, max} (fleet "
                             "chooses it with the GPUs) or one value (kept at every size)")  # fmt: skip
        if self.profile is None or not (self.profile in (*PROFILES, LEARN) or uploaded_profile(self.profile)
                                        or "/" in self.profile):  # fmt: skip
            got = "" if self.profile is None else f" (got {_clip(repr(self.profile))})"
            raise ValueError(f"profile: an elastic job needs a scaling profile{got}: {_PROFILE_KINDS}")
        return self

    @model_validator(mode="after")
    def _total_size(self) -> JobSpec:
        used = sum(len(a.encode()) for a in self.command)
        used += sum(len(k.encode()) + len(v.encode()) for k, v in self.env.items())
        used += sum(len(k.encode()) + len(v.encode()) for k, v in self.labels.items())
        if used > SPEC_BYTES_MAX:
            raise ValueError(
                f"command, env and labels hold {used} bytes together, more than {SPEC_BYTES_MAX}; "
                "ship large inputs as files (a mount or the image), not in the spec"
            )
        return self

    @classmethod
    def parse(cls, data: dict[str, Any]) -> JobSpec:
        """Validate ``data``; raise :class:`SpecError` naming each bad field and what is allowed."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(describe_errors(exc)) from None


def describe_errors(
    exc: ValidationError, model: type[BaseModel] | None = None, what: str = "job spec"
) -> str:
    lines = []
    for err in exc.errors():
        loc = [p for i, p in enumerate(err["loc"]) if not (i == 1 and p in _TAGS)]
        field = ".".join(str(part) for part in loc) or "spec"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            fields = (model or JobSpec).model_fields
            message = f"unknown field; allowed fields: {', '.join(sorted(fields))}"
            if near := get_close_matches(str(err["loc"][-1]), fields, n=1):
                message += f"; did you mean {near[0]!r}?"
        elif err["type"] == "missing":
            message = "is required"
        elif "input" in err and err["type"] not in ("value_error",):
            message = f"{message} (got {_clip(repr(err['input']))})"
        lines.append(f"{field}: {message.removeprefix('Value error, ')}")
    return f"invalid {what}:\n  " + "\n  ".join(lines)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class Exit(BaseModel):
    """How one attempt ended, as the agent saw it."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    code: int | None = None
    oom: bool = False
    reason: str = ""
    #: who is to blame: "job" spends the retry budget, "infra" does not, "cancel" ends the job.
    fault: str = "job"
    #: what kind of infrastructure event, for metrics: node_down, drain, fenced, gpu_busy, lost
    kind: str = ""


class Member(BaseModel):
    """One node's part of a multi-node job."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    node: str
    gpus: list[str] = Field(default_factory=list)


class Progress(BaseModel):
    """The last progress report of a job's current attempt (``fleet_worker.progress`` in the job)."""

    step: int = Field(ge=0)
    #: steps in the whole run, when the job said (what a bar is drawn against)
    total: int | None = Field(default=None, ge=1)
    #: when the job reported it (unix seconds)
    at: float = 0.0
    #: anything else the job reported with it (loss, samples/s, ...)
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        """Done so far, 0..1, or None without a total."""
        return None if self.total is None else min(1.0, self.step / self.total)


class Job(BaseModel):
    """A job as stored: its spec plus where it stands."""

    model_config = _LAZY

    id: str
    spec: JobSpec
    state: JobState
    attempt: int = 0
    failures: int = 0
    infra_requeues: int = 0
    node: str | None = None
    gpus: list[str] = Field(default_factory=list)
    reason: str = ""
    exit_code: int | None = None
    #: the user whose token submitted it ('' for jobs stored without the API)
    owner: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    not_before: float = 0.0
    cancel_requested: bool = False
    #: why fleet asked the attempt to stop for reasons not the job's (drain, preemption), or ""
    preempt: str = ""
    #: the waiting job this attempt is being stopped for (a preemption), or ""
    preempted_for: str = ""
    checkpoint: str | None = None
    #: the current attempt's last progress report, or None
    progress: Progress | None = None
    seq: int = 0
    #: how an attempt ended, written before its container is removed (see JobStore.record_exit)
    last_exit: Exit | None = None
    last_exit_attempt: int = 0
    #: when the job entered its current state (launch deadlines count from it)
    state_since: float = 0.0
    #: a multi-node job's current attempt: its members (node, GPUs) rank 0 first (rank 0's are
    #: ``node`` and ``gpus`` too), where they meet (rank 0's address and a port reserved there),
    #: and how many members run and how many ended with 0; empty for a single-node job
    members: list[Member] = Field(default_factory=list)
    master_addr: str = ""
    master_port: int = 0
    members_running: int = 0
    members_done: int = 0
    #: each member's phase, by rank: "" (not started), starting, running, done
    member_phases: list[str] = Field(default_factory=list)
    #: for a task of a job array: the array's id, the task's index (``FLEET_ARRAY_INDEX``) and how many
    #: of the array's tasks may be on nodes at once (None: no limit); None for a job submitted alone
    array_id: str | None = None
    array_index: int | None = None
    array_max_running: int | None = None
    #: an elastic job's size: the GPUs and global batch of its current attempt (queued: of its next),
    #: 0 until fleet sizes it; when it was last sized; how many times a resize restarted it
    num_gpus: int = 0
    batch_size: int = 0
    sized_at: float = 0.0
    resizes: int = 0
    #: where a resize under way takes it (its attempt is checkpointing to leave; 0 GPUs: back to the
    #: queue until GPUs are free for it), None when none is
    resize_gpus: int | None = None
    resize_batch: int = 0
    #: an elastic job's measured samples/s at each size it ran at, ``"<GPUs>x<global batch>"``: what
    #: its attempts reported (``fleet_worker.report``), newer reports weighing more
    speeds: dict[str, float] = Field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        """GPUs of the current attempt (queued: of the next): the spec's, or an elastic job's size."""
        return self.num_gpus if isinstance(self.spec.gpus, Range) else self.spec.gpus

    @property
    def global_batch(self) -> int | None:
        """``FLEET_BATCH_SIZE``: an elastic job's current batch, else the spec's one value (or None)."""
        if self.spec.elastic and self.batch_size:
            return self.batch_size
        return self.spec.batch_size if isinstance(self.spec.batch_size, int) else None

    @property
    def nodes_held(self) -> list[str]:
        """The nodes the current attempt is bound to: every member's, rank 0 first, or its one node."""
        if self.members:
            return [m.node for m in self.members]
        return [self.node] if self.node else []

    def rank_on(self, node: str) -> int | None:
        """The rank of the member on ``node`` (0 for a single-node job there), or None."""
        held = self.nodes_held
        return held.index(node) if node in held else None

    def gpus_on(self, node: str) -> list[str]:
        rank = self.rank_on(node)
        if rank is None:
            return []
        return self.members[rank].gpus if self.members else self.gpus


class JobArray(BaseModel):
    """A job array as stored (its spec once, for every task) with how its tasks stand."""

    model_config = _LAZY

    kind: Literal["array"] = "array"
    id: str
    #: the spec every task runs; each task adds the labels ``fleet.array`` and ``fleet.array.index``
    spec: JobSpec
    #: the indices in normal form: ``0-9999``, ``1,3,5-9``
    indices: str
    size: int
    #: most tasks on nodes (SCHEDULED, STARTING, RUNNING) at once; None: no limit
    max_running: int | None = None
    owner: str = ""
    created_at: float = 0.0
    #: submission seq of its first task (arrays and jobs list in this order)
    seq: int = 0
    #: tasks in each state (every state present)
    tasks: dict[JobState, int] = Field(default_factory=dict)
    #: ids of its first FAILED tasks (at most 20), lowest index first
    failed: list[str] = Field(default_factory=list)

    @property
    def on_nodes(self) -> int:
        return sum(self.tasks.get(s, 0) for s in ON_NODE_STATES)

    @property
    def done(self) -> bool:
        return sum(self.tasks.get(s, 0) for s in FINAL_STATES) >= self.size


class CancelReport(BaseModel):
    """What a bulk cancel did: jobs cancelled at once (queued), jobs whose agents were told to stop
    them (on nodes: CANCELLED once stopped), and how many were already final."""

    model_config = _LAZY

    cancelled: list[str] = Field(default_factory=list)
    stopping: list[str] = Field(default_factory=list)
    already_final: int = 0


class Event(BaseModel):
    """One entry of a job's history."""

    model_config = _LAZY

    at: float
    state: str
    attempt: int
    reason: str
    node: str | None = None


class NodeState(StrEnum):
    READY = "READY"
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    DOWN = "DOWN"


class Gpu(BaseModel):
    """One GPU as the node's inventory reports it."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    uuid: str
    index: int
    model: str
    memory_total: int
    memory_used: int = 0
    utilization: int = 0
    temperature: int | None = None
    healthy: bool = True
    health: str = "ok"
    processes: list[int] = Field(default_factory=list)
    #: why the GPU is not placeable although healthy ("busy: foreign pid 4242 (python)"), or ""
    busy: str = ""


class Node(BaseModel):
    """A node record: what the agent last published and what operators set."""

    model_config = _LAZY

    name: str
    state: NodeState
    #: what the operator set (READY, CORDONED, ...); ``state`` shows DOWN over it while the lease is gone
    admin_state: NodeState = NodeState.READY
    alive: bool
    reason: str = ""
    heartbeat_at: float = 0.0
    gpus: list[Gpu] = Field(default_factory=list)
    #: allocatable CPUs and memory the agent offers, and what placed jobs were granted of them
    cpus: float = 0
    memory: int = 0
    used_cpus: float = 0
    used_memory: int = 0
    runtime: str = ""
    gpu_backend: str = ""
    #: where the other members of a multi-node job reach this node
    address: str = ""
    #: the operator's labels for the node (agent.labels: rack, ...)
    labels: dict[str, str] = Field(default_factory=dict)
    claims: dict[str, str] = Field(default_factory=dict)
    #: when the admin state last changed, and by whom ("user@host")
    changed_at: float = 0.0
    changed_by: str = ""
    #: DRAINING: running jobs may finish until this time, then get SIGTERM and ``drain_grace_s``
    drain_deadline: float | None = None
    drain_grace_s: float = 0.0
    #: ids of the jobs placed on the node and not yet released
    jobs: list[str] = Field(default_factory=list)


class LogLine(BaseModel):
    """One line of a job's output; ``id`` is its place in the attempt's log stream (a cursor)."""

    id: str
    attempt: int
    line: str

    @property
    def at(self) -> float:
        """When it was shipped (unix seconds): the stream entry id's milliseconds."""
        return int(self.id.split("-", 1)[0]) / 1000


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
    #: POSTed to when any of its jobs ends (a URL, or {url, format}); shown only to the tenant and admins
    webhook: Annotated[Webhook | None, BeforeValidator(_webhook)] = None
    #: the webhook hears node state changes too (READY, CORDONED, DRAINING, DRAINED, DOWN, removed)
    webhook_nodes: bool = False

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


class QueuePosition(BaseModel):
    """Where a QUEUED job stands: jobs ahead of it by rank (priority, then submission), in its tenant
    and in the whole queue. Tenants take turns by fair share, so the overall figure is how many
    outrank it, not the order the fleet will start them in."""

    tenant: str
    #: 1 = next in its tenant
    in_tenant: int
    tenant_queued: int
    overall: int
    queued: int


class QueuedJob(BaseModel):
    """A QUEUED job with where it stands (the status page's queue lists these)."""

    model_config = _LAZY

    job: Job
    position: QueuePosition
