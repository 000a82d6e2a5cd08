"""What a user asks to run: a job spec and its ranges (mounts and webhooks: :mod:`fleet.models.parts`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

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
from fleet.models.base import (
    _ENV_KEY,
    _IMAGE,
    _LABEL_KEY,
    _NAME,
    _USER,
    SPEC_BYTES_MAX,
    Duration,
    Size,
    Text,
    _clip,
    _no_nul,
    _UserModel,
    describe_errors,
    relative_path,
)
from fleet.models.parts import (
    AFTER_MAX,
    Dependency,
    FunctionCall,
    Mount,
    Webhook,
    WorkdirSize,
    _dependency,
    _webhook,
)


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


_RANGE_TEXT = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*\Z")


def _range_text(value: object) -> object:
    """``"1-4"`` (a YAML spec, a CLI flag) as ``{min: 1, max: 4}``; anything else as it is."""
    match = _RANGE_TEXT.match(value) if isinstance(value, str) else None
    return {"min": int(match[1]), "max": int(match[2])} if match else value


def _count_or_range(value: object) -> str:
    return "range" if isinstance(value, dict | Range) else "count"


#: a number, or ``{min, max}`` (``"min-max"``): an elastic job's GPUs or batch size
GpuCount = Annotated[
    Annotated[Annotated[int, Field(ge=0, le=1024)], Tag("count")] | Annotated[Range, Tag("range")],
    Discriminator(_count_or_range),
    BeforeValidator(_range_text),
]
BatchSize = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=1 << 24)], Tag("count")] | Annotated[Range, Tag("range")],
    Discriminator(_count_or_range),
    BeforeValidator(_range_text),
]
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


#: a label's value (a label is for selecting jobs, not for data)
LabelValue = Annotated[str, Field(max_length=256), AfterValidator(_no_nul)]


#: the spec's numbers: a boolean given for one is refused, not read as 1 or 0
_COUNTS = (
    "gpus",
    "nodes",
    "gpus_per_node",
    "cpus",
    "priority",
    "max_attempts",
    "batch_size",
    "max_batch_per_gpu",
)


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
    labels: dict[Annotated[str, Field(pattern=_LABEL_KEY)], LabelValue] = Field(
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
    #: what that directory holds: set by the API at submit from what was uploaded (a value sent is
    #: replaced); None for no workdir, or one uploaded before fleet recorded sizes
    workdir_size: WorkdirSize | None = None
    #: a directory inside the working directory whose contents fleet keeps when each attempt ends
    #: (the latest attempt's, within the tenant's outputs quota): ``fleet download JOB``
    outputs: str = Field(default="outputs", max_length=1024, description="relative path, no '..'")
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
    #: an elastic job's largest per-GPU batch that fits a GPU's memory: fleet never gives a GPU more
    #: (default: a bundled or uploaded profile's measured largest; with ``learn``, the largest it ran at,
    #: so that its batch grows only with its GPUs: declaring it lets fleet try larger per-GPU batches)
    max_batch_per_gpu: int | None = Field(default=None, ge=1, le=1 << 24)
    #: queue it even when no registered node could ever hold it (for a node not registered yet);
    #: without it such a job is refused at submit (see fleet.api.placeable)
    allow_unplaceable: bool = False
    #: the job's stdin is a pipe fed through the API (``POST /v1/jobs/{id}/stdin``, which ``fleet run``
    #: sends its own stdin to) instead of /dev/null: a job of one node, not an array's task
    stdin: bool = False
    #: a function job's call (``fleet.function``): the node writes it where the job's runner
    #: (``python3 -m fleet_worker.call``) reads it
    call: FunctionCall | None = None
    #: jobs this one waits for (``{job, when}``; an array's id: all its tasks): it stays QUEUED until
    #: each is satisfied, and is cancelled when one can no longer be (see fleet.scheduler.dependencies)
    after: list[Annotated[Dependency, BeforeValidator(_dependency)]] = Field(
        default_factory=list, max_length=AFTER_MAX
    )

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

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, value: str) -> str:
        fix = "give a directory inside the job's working directory, e.g. 'outputs' or 'runs/out'"
        if not (kept := relative_path(value, fix)):
            raise ValueError(f"the working directory itself cannot be kept; {fix}")
        return kept

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

    @field_validator(*_COUNTS, mode="before")
    @classmethod
    def _not_a_bool(cls, value: object) -> object:
        """A YAML ``true`` is no count: pydantic would take it as 1 (``gpus: true``, one GPU)."""
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {str(value).lower()} (true and false are not counts)")
        return value

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
                raise ValueError(
                    "batch_size: a range of batch sizes needs a range of GPUs too (gpus: "
                    "{min, max}); a job of fixed size takes one batch size"
                )
            if self.profile is not None:
                raise ValueError("profile: only an elastic job (gpus: {min, max}) uses a scaling profile")
            if self.max_batch_per_gpu is not None:
                raise ValueError(
                    "max_batch_per_gpu: only an elastic job (gpus: {min, max}) has fleet choose "
                    "its batch per GPU; a job of fixed size sets its own"
                )
            return self
        for pinned in ("nodes", "gpus_per_node"):
            if getattr(self, pinned) is not None:
                raise ValueError(
                    f"{pinned}: an elastic job's size is fleet's to choose; drop {pinned} (a "
                    "size larger than a node runs on several, one member each)"
                )
        if self.batch_size is None:
            raise ValueError(
                "batch_size: an elastic job needs its global batch size: {min, max} (fleet "
                "chooses it with the GPUs) or one value (kept at every size)"
            )
        if self.profile is None or not (
            self.profile in (*PROFILES, LEARN) or uploaded_profile(self.profile) or "/" in self.profile
        ):
            got = "" if self.profile is None else f" (got {_clip(repr(self.profile))})"
            raise ValueError(f"profile: an elastic job needs a scaling profile{got}: {_PROFILE_KINDS}")
        return self

    @model_validator(mode="after")
    def _one_stdin(self) -> JobSpec:
        """Forwarded input has one reader: a job of one node, of a fixed size."""
        if self.stdin and ((self.nodes or 1) > 1 or self.elastic):
            raise ValueError(
                "stdin: only a job on one node reads forwarded input; drop stdin (fleet run --no-stdin) "
                "or nodes/elastic gpus"
            )
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
            raise SpecError(describe_errors(exc, cls)) from None
