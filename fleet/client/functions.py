"""Functions on the fleet: ``@fleet.function(gpus=1, workdir=".")`` on a module-level function makes
``f.submit(*args, **kwargs)`` run it as a job and return a :class:`FunctionHandle`, whose
``result()`` is the function's return value (or its exception, raised again here); ``f(*args)``
still runs it here, unchanged.

The call travels as one content-addressed blob through the API (``PUT /v1/blobs``): the function
(pickled by value when it is defined in a script, else named by module and qualified name and
imported on the node from the shipped ``workdir``) and its arguments, pickled with cloudpickle
behind a header naming the caller's Python and cloudpickle, so a job whose own differ says so in
words. An argument that cannot be pickled is refused here, naming it, before anything is sent. The
node hands the blob to the job without reading it; the job's runner (``python3 -m
fleet_worker.call``) makes the call and leaves the outcome with the job's kept outputs, where
``result()`` reads it (:mod:`fleet.client.outcomes`).
"""

from __future__ import annotations

import functools
import io
import re
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from fleet.client.outcomes import FunctionHandle
from fleet.errors import SpecError
from fleet_worker.call import CALL_MAGIC, pack, versions

if TYPE_CHECKING:
    from fleet.client.sync import Client

P = ParamSpec("P")
R = TypeVar("R")
#: the largest call (function and arguments, pickled) sent; the API takes blobs up to its
#: ``workdir_max_bytes`` (64 MiB by default)
CALL_MAX_BYTES = 64 << 20
#: spec fields that are fleet's to set for a function's job
_OWN = ("command", "call")
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 40, 40, 2
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


class Function(Generic[P, R]):
    """A function that runs here when called and on the fleet with :meth:`submit`."""

    def __init__(
        self, fn: Callable[P, R], python: str, client: Client | None, fields: dict[str, Any]
    ) -> None:
        self.fn, self.python, self.client, self.fields = fn, python, client, fields
        functools.update_wrapper(self, fn)
        self._spec(None)  # a bad field is refused at decoration, naming it

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"fleet.function({self.name})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (a function defined beside it refers to it) without its client."""
        return (Function, (self.fn, self.python, None, self.fields))

    def on(self, client: Client) -> Function[P, R]:
        """The same function, submitted with ``client`` (another API or token)."""
        return Function(self.fn, self.python, client, self.fields)

    def options(self, *, python: str | None = None, **fields: Any) -> Function[P, R]:
        """The same function with other spec fields (``gpus=4``, ``image=...``) or interpreter."""
        _check_own(fields, python or self.python)
        return Function(self.fn, python or self.python, self.client, {**self.fields, **fields})

    @property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> FunctionHandle[R]:
        """Run the call as a job; its handle. Nothing is sent when an argument cannot be pickled."""
        data = pickle_call(self.fn, args, kwargs)
        client = self.client or _default_client()
        blob = client.upload_blob(data)
        call = {"blob": blob, "function": self.name, "args": summary(args, kwargs)}
        handle = client.submit(self._spec(call))
        return FunctionHandle(client, handle.id, self.name)

    def _spec(self, call: dict[str, Any] | None) -> dict[str, Any]:
        """The job spec of a call (checked: :class:`SpecError` naming a bad field)."""
        from fleet.models import JobSpec

        fields = {"name": job_name(self.fn.__name__), "max_attempts": 1, **self.fields}
        outputs = str(fields.get("outputs", "outputs"))
        fields["command"] = [self.python, "-m", "fleet_worker.call", outputs]
        if call is not None:
            fields["call"] = call
        JobSpec.parse({k: v for k, v in fields.items() if k != "workdir"})  # a local path until shipped
        return fields


@overload
def function(fn: Callable[P, R], /) -> Function[P, R]: ...
@overload
def function(
    *, python: str = "python3", client: Client | None = None, **fields: Any
) -> Callable[[Callable[P, R]], Function[P, R]]: ...


def function(
    fn: Callable[P, R] | None = None,
    /,
    *,
    python: str = "python3",
    client: Client | None = None,
    **fields: Any,
) -> Function[P, R] | Callable[[Callable[P, R]], Function[P, R]]:
    """``@fleet.function`` or ``@fleet.function(gpus=1, image=..., workdir=".", timeout="2h", ...)``:
    any :class:`fleet.JobSpec` field but ``command``. ``python``: the program that runs the call on
    the node (it needs cloudpickle and fleet_worker: fleet's images and environment have them).
    ``client``: the :class:`fleet.Client` to submit with (default: one made from the environment).
    A function job makes one attempt unless ``max_attempts`` says more (a node lost or drained
    requeues it all the same, without counting)."""
    _check_own(fields, python)

    def wrap(target: Callable[P, R]) -> Function[P, R]:
        check_module_level(target)
        return Function(target, python, client, fields)

    return wrap if fn is None else wrap(fn)


def _check_own(fields: dict[str, Any], python: str) -> None:
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


def pickle_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The call as the runner reads it; :class:`SpecError` naming an argument that cannot be
    pickled, or a call larger than :data:`CALL_MAX_BYTES`."""
    import cloudpickle

    by_value = fn.__module__ == "__main__"  # a script's: no module the node could import
    header = {**versions(), "module": fn.__module__, "qualname": fn.__qualname__}
    try:
        payload = cloudpickle.dumps((fn if by_value else None, args, kwargs))
    except Exception as exc:
        raise SpecError(_culprit(fn, args, kwargs, exc)) from exc
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
def _default_client() -> Client:
    from fleet.client.sync import Client

    return Client()


__all__ = ["CALL_MAX_BYTES", "Function", "FunctionHandle", "function"]
