"""A function's call as it travels (:mod:`fleet.client.functions`, :mod:`fleet.client.executor`):
pickled with cloudpickle behind a header naming the caller's Python and cloudpickle, uploaded as a
blob, and the spec of the job that makes it (``python3 -m fleet_worker.call``). An argument that
cannot be pickled is refused here, naming it, before anything is sent. A function's handle among the
arguments is pickled as a placeholder for its result (:class:`fleet.client.outcomes.FunctionHandle`):
the job waits for that call to succeed (``after``) and is handed its outcome (``call.inputs``).
"""

from __future__ import annotations

import functools
import io
import re
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.client.outcomes import PASSED
from fleet.errors import SpecError
from fleet_worker.formats import CALL_MAGIC, pack, versions

if TYPE_CHECKING:
    from fleet.client.sync import Client

#: the largest call (function and arguments, pickled) sent; the API takes blobs up to its
#: ``workdir_max_bytes`` (64 MiB by default)
CALL_MAX_BYTES = 64 << 20
#: spec fields that are fleet's to set for a function's job
_OWN = ("command", "call")
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 40, 40, 2
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def check_own(fields: dict[str, Any], python: str) -> None:
    for own in _OWN:
        if own in fields:
            raise SpecError(
                f"{own}: a function's job runs its call ({python} -m fleet_worker.call); give "
                "python= for another interpreter"
            )


def check_module_level(fn: Callable[..., Any]) -> None:
    if not callable(fn) or not hasattr(fn, "__qualname__"):
        raise SpecError(f"fleet.function: {fn!r} is not a function; decorate a def at module level")
    if "<locals>" in fn.__qualname__ or "<lambda>" in fn.__qualname__:
        raise SpecError(
            f"fleet.function: {fn.__qualname__} is not defined at module level: the node imports it "
            "from its module; define it there"
        )


def pickle_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], passed: list[str] | None = None
) -> bytes:
    """The call as the runner reads it; :class:`SpecError` naming an argument that cannot be
    pickled, or a call larger than :data:`CALL_MAX_BYTES`. ``passed``: where the ids of the jobs
    whose handles the arguments hold are added (without it, such a handle is refused)."""
    import cloudpickle

    # a script's, or a lambda or local function (fleet.Executor takes them): nothing the node imports
    by_value = fn.__module__ == "__main__" or "<" in fn.__qualname__
    header = {**versions(), "module": fn.__module__, "qualname": fn.__qualname__}
    token = PASSED.set(passed)
    try:
        payload = cloudpickle.dumps((fn if by_value else None, args, kwargs))
    except Exception as exc:
        raise SpecError(_culprit(fn, args, kwargs, exc)) from exc
    finally:
        PASSED.reset(token)
    if len(payload) > CALL_MAX_BYTES:
        raise SpecError(
            f"{fn.__qualname__}: its arguments pickle to {len(payload)} bytes, more than "
            f"{CALL_MAX_BYTES}; pass a path the job can read (a mount, its workdir) instead of the data"
        )
    call: bytes = pack(CALL_MAGIC, header, bytes(payload))
    return call


def _culprit(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception) -> str:
    """Which argument cannot be pickled, in words (the first found; the function itself otherwise)."""
    import cloudpickle

    named = [(f"argument {i + 1}", a) for i, a in enumerate(args)]
    named += [(f"argument {k}=", v) for k, v in kwargs.items()]
    for what, value in named:
        try:
            cloudpickle.dump(value, io.BytesIO())
        except Exception as own:
            return (
                f"{fn.__qualname__}: {what} ({_SHORT.repr(value)}, a {type(value).__qualname__}) "
                f"cannot be pickled ({type(own).__name__}: {own}); pass what it is made from and "
                "make it inside the function"
            )
    return f"{fn.__qualname__}: the function cannot be pickled ({type(exc).__name__}: {exc})"


def summary(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The arguments as ``fleet show`` tells them: short reprs, at most 1,000 characters."""
    parts = [_SHORT.repr(a) for a in args] + [f"{k}={_SHORT.repr(v)}" for k, v in kwargs.items()]
    text = ", ".join(parts).replace("\x00", "")
    return text if len(text) <= 1000 else text[:997] + "..."


def job_name(name: str) -> str:
    """A job name (``JobSpec.name``'s pattern) from a function's name."""
    cleaned = _NAME_BAD.sub("-", name).strip("_.-")[:63]
    return cleaned or "function"


@functools.cache
def default_client() -> Client:
    from fleet.client.sync import Client

    return Client()


def job_fields(
    fn: Callable[..., Any], python: str, fields: dict[str, Any], call: dict[str, Any] | None
) -> dict[str, Any]:
    """The job spec of a call of ``fn`` (checked: :class:`SpecError` naming a bad field)."""
    from fleet.models import JobSpec

    spec = {"name": job_name(fn.__name__), "max_attempts": 1, **fields}
    outputs = str(spec.get("outputs", "outputs"))
    spec["command"] = [python, "-m", "fleet_worker.call", outputs]
    if call is not None:
        spec["call"] = call
    JobSpec.parse({k: v for k, v in spec.items() if k != "workdir"})  # a local path until shipped
    return spec


def call_spec(
    client: Client,
    fn: Callable[..., Any],
    python: str,
    fields: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """The spec of a job making the call ``fn(*args, **kwargs)``, its call uploaded; one that takes
    other calls' results (their handles among its arguments) waits for each to succeed."""
    passed: list[str] = []
    blob = client.upload_blob(pickle_call(fn, args, kwargs, passed))
    inputs = list(dict.fromkeys(passed))  # a handle passed twice is one job to wait for
    call: dict[str, Any] = {"blob": blob, "function": f"{fn.__module__}.{fn.__qualname__}"}
    call["args"] = summary(args, kwargs)
    if inputs:
        call["inputs"] = inputs
        fields = {**fields, "after": [*fields.get("after", []), *(f"{i}:ok" for i in inputs)]}
    return job_fields(fn, python, fields, call)
