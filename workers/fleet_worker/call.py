"""Run a function job's call: ``python3 -m fleet_worker.call OUTPUTS`` is the command of every job
``fleet.function``'s ``submit`` queues.

The node writes the call (what the caller pickled: the function, or where to import it from, and
its arguments) to ``OUTPUTS/.fleet-function/call`` in the job's working directory. This reads it,
imports the function's module (from the working directory first: the shipped ``workdir``), calls
it, and leaves the outcome in ``OUTPUTS/.fleet-function/outcome``, which fleet keeps with the job's
outputs and the caller's ``result()`` reads: the return value, the exception raised with its
traceback, or why the call could not be made at all (in words: a Python or cloudpickle version that
differs from the caller's, a module the node cannot find). It exits 0 when the function returned,
1 otherwise. Unpickling happens here, in the job, as the tenant's own code, and in the caller.

A call may take other calls' results as arguments (``g.submit(f.submit(x))``): the caller pickled
each such handle as :func:`result_of` its job, and the node, once those jobs succeeded, put their
outcomes in ``OUTPUTS/.fleet-function/inputs/<job id>``, where unpickling the call reads them.

A map's job array (``f.map``) has one call file for all its tasks
(:func:`fleet_worker.formats.pack_calls`): the function pickled once, then each call's arguments
pickled on their own; task ``i`` (``FLEET_ARRAY_INDEX``) unpickles the function and its own
arguments only. With ``chunksize`` N, task ``i`` makes calls ``i*N`` to ``i*N+N-1`` one after
another in this one process (the function unpickled or imported once), each call's arguments
unpickled just before it, and appends each call's outcome as it ends to a ``fleet-outcomes 1`` file:
a call that raised, or whose arguments would not unpickle, loses no other's result, and the calls
after it are made all the same. Such a task exits 0 when every call returned, 1 otherwise, as a
single call does: its job FAILED (the function's own exception spends one of the job's
``max_attempts``, which is 1 unless the caller asked for more), and an attempt that runs again, after
that or a node lost, makes every call of the task again: a task's results are those of one attempt.
A job of no array whose file holds one task's calls (``fleet.Executor.map``'s chunks) makes them all.
A call that cannot be made at all (the versions differ, the function's module is missing) leaves a
single ``fleet-outcome 1`` that stands for each of the task's calls.

The files' formats are :mod:`fleet_worker.formats`'. The job's Python needs ``cloudpickle`` (of the
caller's version) and this package: fleet's own environment has both, and so do the images fleet
builds (``localhost/fleet/python``, ``localhost/fleet/torch``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import shutil
import sys
import traceback
import types
from typing import Any

from fleet_worker.formats import (
    CALL,
    CALL_MAGIC,
    CALLS_MAGIC,
    CHUNKS_MAGIC,
    FOLDER,
    INPUTS,
    OUTCOME,
    OUTCOME_MAGIC,
    OUTCOMES_MAGIC,
    OUTCOMES_MAX_BYTES,
    RAISED,
    REFUSED,
    RESULT_MAX_BYTES,
    RETURNED,
    Refused,
    outcome_entry,
    pack,
    status,
    task_calls,
    unpack,
    versions,
)


def _array_index() -> int | None:
    raw = os.environ.get("FLEET_ARRAY_INDEX", "")
    return int(raw) if raw.isdigit() else None


def mismatch(caller: dict[str, Any], here: dict[str, str], cause: BaseException | None = None) -> str:
    """Why a pickle made by ``caller``'s versions may not read here, or "" when they match."""
    if not here["cloudpickle"]:
        return (
            f"cloudpickle is not installed in the job's Python ({sys.executable}): the image needs "
            f"cloudpickle=={caller.get('cloudpickle')} (pip install cloudpickle), as the caller has"
        )
    minor = ".".join(str(caller.get("python", "")).split(".")[:2])
    if minor != ".".join(here["python"].split(".")[:2]):
        return (
            f"the call was pickled by Python {caller.get('python')} and the job runs Python "
            f"{here['python']}: run it in an image of Python {minor} (image=...), or call it from "
            f"Python {'.'.join(here['python'].split('.')[:2])}"
        )
    if cause is not None and caller.get("cloudpickle") != here["cloudpickle"]:
        return (
            f"the call was pickled by cloudpickle {caller.get('cloudpickle')} and the job has "
            f"cloudpickle {here['cloudpickle']}, which cannot read it ({type(cause).__name__}: {cause}): "
            "install the same version on both sides"
        )
    return ""


#: whether the runner stood in for fleet (see :func:`_stand_in_for_fleet`)
_STAND_IN: list[bool] = []


def _stand_in_for_fleet() -> None:
    """A module whose functions are decorated with ``@fleet.function`` imports fleet, which an image
    need not hold (fleet_worker and cloudpickle are what a call needs): where it has none,
    ``fleet.function`` is a decorator that leaves the function as it is."""
    if importlib.util.find_spec("fleet") is not None:
        return
    shim = types.ModuleType("fleet", "fleet.function only, as a job's runner stands in for fleet")

    def function(fn: Any = None, **fields: Any) -> Any:
        return fn if fn is not None else (lambda target: target)

    shim.function = function  # type: ignore[attr-defined]
    sys.modules["fleet"] = shim
    _STAND_IN.append(True)


def _function(header: dict[str, Any], by_value: Any) -> Any:
    """The function to call: the one pickled by value (defined in a script), or imported from its
    module, unwrapped from ``fleet.function``'s wrapper."""
    if by_value is not None:
        return by_value
    module_name, qualname = str(header["module"]), str(header["qualname"])
    _stand_in_for_fleet()
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise Refused(
            f"cannot import {exc.name!r} for {module_name}.{qualname} in the job (its working directory "
            f"{os.getcwd()} and {sys.executable}'s packages): ship the code with workdir='.' (run "
            "from the folder the module is found in) or install it in the image"
        ) from exc
    except Exception as exc:
        stand_in = " (fleet is not installed here: only fleet.function stands in)" if _STAND_IN else ""
        raise Refused(
            f"importing {module_name} failed in the job: {type(exc).__name__}: {exc}{stand_in}"
        ) from exc
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise Refused(
                f"{module_name} as shipped has no {qualname}: the code shipped differs from the caller's"
            )
    return getattr(found, "__wrapped__", found)


#: a job's id, as fleet allows it (it names a file here)
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
#: while a call is unpickled: the folder of the outcomes passed to it, and the results read so far
_INPUTS: list[str] = []
_PASSED: dict[str, Any] = {}


def result_of(job_id: str) -> Any:
    """What job ``job_id``'s call returned, where the caller passed its handle as an argument: read
    from the outcome the node put beside the call. One job's result is one object, however often it
    is passed."""
    if job_id in _PASSED:
        return _PASSED[job_id]
    if not _INPUTS or not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise Refused(f"the result of job {job_id!r} is an argument, but the node handed the job none")
    try:
        with open(os.path.join(_INPUTS[0], job_id), "rb") as file:
            data = file.read()
        if data.startswith(OUTCOMES_MAGIC):
            raise Refused(
                f"job {job_id}, whose result is an argument, made several calls of a map: pass a value"
            )
        header, payload = unpack(OUTCOME_MAGIC, data)
    except (OSError, ValueError) as exc:
        raise Refused(f"the result of job {job_id}, an argument of the call, is not here: {exc}") from None
    if header.get("status") != RETURNED:
        raise Refused(f"job {job_id}, whose result is an argument of the call, returned none")
    if why := mismatch(header, versions()):
        raise Refused(f"the result of job {job_id}, an argument of the call: {why}")
    import cloudpickle

    value = _PASSED[job_id] = cloudpickle.loads(payload)
    return value


def _read(path: str) -> tuple[dict[str, Any], list[bytes], bytes | None, int | None]:
    """The call's header and pickle; for a map's task, its own calls' pickles, the function's, and
    the first call's number among the map's items."""
    try:
        with open(path, "rb") as file:
            data = file.read()
        if data.startswith((CALLS_MAGIC, CHUNKS_MAGIC)):
            header, function, calls, first = task_calls(data, _array_index())
            return header, calls, function, first
        header, payload = unpack(CALL_MAGIC, data)
    except (OSError, ValueError) as exc:
        raise Refused(f"no call to make at {path}: {exc}") from None
    return header, [payload], None, None


def _loads(header: dict[str, Any], data: bytes) -> Any:
    """A pickle of the call; :class:`Refused` saying why it cannot be read here."""
    import cloudpickle

    try:
        return cloudpickle.loads(data)
    except Refused:
        raise
    except ModuleNotFoundError as exc:
        raise Refused(
            f"cannot import {exc.name!r}, which the call's function or arguments need, in the job: "
            "ship the code with workdir='.' or install it in the image"
        ) from exc
    except Exception as exc:
        why = mismatch(header, versions(), exc) or f"cannot unpickle the call: {type(exc).__name__}: {exc}"
        raise Refused(why) from exc


class Task:
    """A map's task of several calls (``chunksize``): the function, and each call's pickle."""

    def __init__(self, header: dict[str, Any], fn: Any, calls: list[bytes], first: int) -> None:
        self.header, self.fn, self.calls, self.first = header, fn, calls, first


def _load(path: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | Task:
    header, calls, function, first = _read(path)
    if why := mismatch(header, versions()):
        raise Refused(why)
    _INPUTS[:] = [os.path.join(os.path.dirname(path), INPUTS)]
    try:
        if function is None:
            fn, args, kwargs = _loads(header, calls[0])
        else:
            fn = _loads(header, function) if function else None
            if int(header.get("chunksize", 1)) > 1:
                return Task(header, _function(header, fn), calls, first or 0)
            args, kwargs = _loads(header, calls[0])
    finally:
        _INPUTS.clear()
        _PASSED.clear()
    return _function(header, fn), args, kwargs


def _outcome(status: str, value: Any, error: BaseException | None = None) -> bytes:
    import cloudpickle

    header: dict[str, Any] = {"status": status, **versions()}
    if error is not None:
        header.update(
            type=f"{type(error).__module__}.{type(error).__qualname__}",
            message=str(error),
            traceback="".join(traceback.format_exception(error)),
        )
    try:
        payload = cloudpickle.dumps(value if error is None else error)
    except Exception as exc:
        if error is not None:  # the exception comes back in words (its type, message, traceback)
            return pack(OUTCOME_MAGIC, header, b"")
        return _outcome(REFUSED, None, Refused(f"the return value cannot be pickled: {exc}"))
    if error is None and len(payload) > RESULT_MAX_BYTES:
        why = f"the return value is {len(payload)} bytes pickled, more than {RESULT_MAX_BYTES}"
        return _outcome(REFUSED, None, Refused(why + ": write it to the job's outputs and return its name"))
    return pack(OUTCOME_MAGIC, header, payload)


def _write(folder: str, data: bytes) -> None:
    """The outcome, written to a temporary name and renamed: never a half outcome."""
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{OUTCOME}.{os.getpid()}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, os.path.join(folder, OUTCOME))


def run(outputs: str) -> int:
    """Make the call (or a map's task's calls) found under ``outputs``, leave the outcome there; the
    exit status."""
    folder = os.path.join(outputs, FOLDER)
    sys.path.insert(0, os.getcwd())  # the shipped working directory: the function's module is here
    try:
        loaded = _load(os.path.join(folder, CALL))
    except Refused as exc:
        _write(folder, _outcome(REFUSED, None, exc))
        print(f"fleet: the call was not made: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # an argument's own code failed to unpickle (its class's __setstate__)
        _write(folder, _outcome(RAISED, None, exc))
        traceback.print_exc()
        return 1
    with contextlib.suppress(FileNotFoundError):  # kept outputs need not hold the arguments again
        os.remove(os.path.join(folder, CALL))
    shutil.rmtree(os.path.join(folder, INPUTS), ignore_errors=True)
    if isinstance(loaded, Task):
        return _run_task(folder, loaded)
    fn, args, kwargs = loaded
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        _write(folder, _outcome(RAISED, None, exc))
        traceback.print_exc()
        return 1
    _write(folder, _outcome(RETURNED, value))
    return 0


def _made(task: Task, call: bytes) -> bytes:
    """One of a task's calls made: its outcome."""
    try:
        args, kwargs = _loads(task.header, call)
    except Refused as exc:
        print(f"fleet: the call was not made: {exc}", file=sys.stderr)
        return _outcome(REFUSED, None, exc)
    try:
        value = task.fn(*args, **kwargs)
    except Exception as exc:
        traceback.print_exc()
        return _outcome(RAISED, None, exc)
    return _outcome(RETURNED, value)


def _run_task(folder: str, task: Task) -> int:
    """Make a task's calls one after another, each one's outcome appended to the task's as it ends
    (a call that raised loses no other's; a task killed midway keeps those that ended): exit 0 when
    every call returned, else 1."""
    failed, total = 0, 0
    with open(os.path.join(folder, OUTCOME), "wb") as file:
        file.write(pack(OUTCOMES_MAGIC, {**versions(), "first": task.first, "calls": len(task.calls)}, b""))
        for number, call in enumerate(task.calls):
            print(f"fleet: item {task.first + number}", file=sys.stderr, flush=True)
            outcome = _made(task, call)
            if total + len(outcome) > OUTCOMES_MAX_BYTES:
                why = (
                    f"the task's outcomes come to more than {OUTCOMES_MAX_BYTES} bytes: map with a smaller "
                    "chunksize, or write the results to the job's outputs and return their names"
                )
                outcome = _outcome(REFUSED, None, Refused(why))
            total += len(outcome)
            failed += status(outcome) != RETURNED
            file.write(outcome_entry(outcome))
            file.flush()
        os.fsync(file.fileno())
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m fleet_worker.call OUTPUTS (the job's outputs directory)")
    # run by the module the call's pickle names (result_of's), not by this copy, ``__main__``
    from fleet_worker import call

    sys.exit(call.run(sys.argv[1]))
