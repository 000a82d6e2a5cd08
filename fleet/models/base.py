"""What every model shares: the name patterns, sizes and durations as users write them, and user-facing
models whose construction errors name the field and the fix."""

from __future__ import annotations

import re
from difflib import get_close_matches
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from fleet.errors import SpecError

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: a job id becomes a Redis key and a directory name: no ':', no '/', never '.' or '..'
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_LABEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$"
#: numeric uid[:gid]: names resolve differently on the host and in each image
_USER = r"^\d{1,10}(:\d{1,10})?$"
#: a Docker image reference: [registry[:port]/]path[:tag][@digest], lower-case path
_IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}$"
#: an uploaded blob, named by the SHA-256 of its bytes
_DIGEST = r"^sha256:[0-9a-f]{64}$"
#: every model builds its validators on first use, not at import: a CLI command pays for the ones it uses
_LAZY = ConfigDict(defer_build=True)
#: bytes a spec's command, env or labels may hold in total (the record lives in Redis)
SPEC_BYTES_MAX = 128 << 10
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*\Z", re.IGNORECASE)
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

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d|days?)?\s*\Z", re.IGNORECASE)
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


def relative_path(value: str, fix: str) -> str:
    """``value`` as a clean path relative to a directory (``a/b``): never absolute, never ``..``,
    no NUL, at most 1024 characters; ``ValueError`` saying ``fix`` otherwise. ``.`` parts and doubled
    slashes are dropped; "" (or ``.``) is the directory itself."""
    if not isinstance(value, str) or len(value) > 1024 or "\x00" in value:
        raise ValueError(f"{fix} (at most 1024 characters, no NUL)")
    if value.startswith("/"):
        raise ValueError(f"{value!r} is an absolute path; {fix}")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{value!r} leads out of the directory ('..'); {fix}")
    return "/".join(parts)


def check_job_id(job_id: str) -> str:
    """``job_id`` if valid, else :class:`SpecError` naming the rule: ids become keys and paths."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise SpecError(
            f"job id {_clip(repr(job_id))} is invalid: use 1-128 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return job_id


#: the tags that tell a count from a range: left out of the field names errors print
TAGS = ("count", "range")


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


#: what each pattern a user's value must match says, in words
PATTERN_WORDS = {
    _NAME: "1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit",
    _LABEL_KEY: "1 to 63 letters, digits, '_', '.', '/' or '-', starting with a letter or digit",
    _USER: "a numeric uid, or uid:gid (e.g. 1000 or 1000:1000)",
    r"^\d{1,10}-\d{1,10}$": "a range of numbers FIRST-LAST (e.g. 1000000000-1000999999)",
    _IMAGE: (
        "an image reference (repo/name:tag or name@sha256:...): up to 255 letters, digits and "
        "'.', '_', ':', '/', '@', '+', '-', starting with a letter or digit"
    ),
    _DIGEST: "sha256: and the 64 hex digits of an uploaded blob's SHA-256 (fleet.function uploads its call)",
}


def in_words(pattern: str) -> str:
    """What a value matching ``pattern`` looks like, said in words (the pattern itself if unknown)."""
    return PATTERN_WORDS.get(pattern, f"text matching {pattern}")


def describe_errors(
    exc: ValidationError, model: type[BaseModel] | None = None, what: str = "job spec"
) -> str:
    """One line per error, naming the field; an unknown field with the allowed ones of ``model``."""
    lines = []
    for err in exc.errors():
        loc = [p for i, p in enumerate(err["loc"]) if not (i == 1 and p in TAGS)]
        field = ".".join(str(part) for part in loc) or "spec"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            fields = model.model_fields if model is not None else {}
            message = f"unknown field; allowed fields: {', '.join(sorted(fields))}"
            if near := get_close_matches(str(err["loc"][-1]), fields, n=1):
                message += f"; did you mean {near[0]!r}?"
        elif err["type"] == "missing":
            message = "is required"
        elif err["type"] == "string_pattern_mismatch":
            said = in_words(str(err.get("ctx", {}).get("pattern", "")))
            message = f"must be {said} (got {_clip(repr(err.get('input')))})"
        elif "input" in err and err["type"] not in ("value_error",):
            message = f"{message} (got {_clip(repr(err['input']))})"
        lines.append(f"{field}: {message.removeprefix('Value error, ')}")
    return f"invalid {what}:\n  " + "\n  ".join(lines)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
