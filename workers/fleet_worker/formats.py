"""The files of a function job's call and its outcome (:mod:`fleet_worker.call` reads the one and
writes the other; the caller, ``fleet.function``, writes the one and reads the other): one line of
magic naming the format, one line of JSON (the header), then the pickle (or pickles).

``fleet-call 1``: one call, the function and its arguments in one pickle. ``fleet-calls 1``: a map's
calls (one job array), the function pickled once and then each call's arguments, their ends in the
header; task ``i`` makes call ``i``. ``fleet-chunks 1``: the same, task ``i`` making ``chunksize``
calls from call ``i * chunksize`` (a runner that knows no chunks refuses the file, rather than make
one call of each task). ``fleet-outcome 1``: what one call came to (``status``, and the exception in
words) and the pickle of its value or exception. ``fleet-outcomes 1``: a task's calls' outcomes, the
header naming the first call's number among the map's items and how many the task holds, then
each call's ``fleet-outcome 1`` in turn, after a line giving its length: appended as each call ends,
so a task killed midway leaves those that ended (a last one cut short is not read).
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any

#: where the call and its outcome are, inside the job's outputs directory
FOLDER = ".fleet-function"
CALL, OUTCOME = "call", "outcome"
#: the folder, beside the call, of the outcomes of the jobs whose results are its arguments
INPUTS = "inputs"
#: what each file starts with, so that neither is taken for the other, nor an old format for this one
CALL_MAGIC, OUTCOME_MAGIC = b"fleet-call 1\n", b"fleet-outcome 1\n"
#: what a map's calls start with: one per task of its job array, or several (``chunksize``)
CALLS_MAGIC, CHUNKS_MAGIC = b"fleet-calls 1\n", b"fleet-chunks 1\n"
#: what the outcome of a task of several calls starts with: each call's outcome in turn
OUTCOMES_MAGIC = b"fleet-outcomes 1\n"
#: the largest return value (pickled) brought back; a larger one is refused, saying so
RESULT_MAX_BYTES = 64 << 20
#: the most bytes of a task's outcomes in all (the caller reads them at once): a call past it is refused
OUTCOMES_MAX_BYTES = 256 << 20
#: what the outcome says of the call
RETURNED, RAISED, REFUSED = "returned", "raised", "refused"


def versions() -> dict[str, str]:
    """The Python and cloudpickle of this process: a pickle is read only by the same ones."""
    try:
        import cloudpickle

        pickler = str(cloudpickle.__version__)
    except ImportError:
        pickler = ""
    return {"python": platform.python_version(), "cloudpickle": pickler}


def pack(magic: bytes, header: dict[str, Any], payload: bytes) -> bytes:
    return magic + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def unpack(magic: bytes, data: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and the pickle of a call or outcome; ``ValueError`` for anything else."""
    if not data.startswith(magic):
        raise ValueError(f"not a {magic.decode().split()[0]} of this format")
    line, _, payload = data[len(magic) :].partition(b"\n")
    header = json.loads(line)
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header, payload


class Refused(Exception):
    """The call could not be made (the job's environment, not the function): said in words."""


def pack_calls(header: dict[str, Any], function: bytes, calls: list[bytes], chunksize: int = 1) -> bytes:
    """A map's calls in one file: ``header`` (versions, module, qualname), the function's pickle
    (empty when the node imports it) and each call's pickle of ``(args, kwargs)``, in order; task
    ``i`` makes call ``i``, or with ``chunksize`` N calls ``i*N`` to ``i*N+N-1`` (another magic, so
    that a runner that knows no chunks refuses them rather than making one call of each)."""
    ends: list[int] = []
    end = 0
    for call in calls:
        end += len(call)
        ends.append(end)
    header = {**header, "function": len(function), "ends": ends}
    if chunksize == 1:
        return pack(CALLS_MAGIC, header, function + b"".join(calls))
    return pack(CHUNKS_MAGIC, {**header, "chunksize": chunksize}, function + b"".join(calls))


def task_calls(data: bytes, index: int | None) -> tuple[dict[str, Any], bytes, list[bytes], int]:
    """Task ``index``'s calls in a map's calls (:func:`pack_calls`): the header, the function's
    pickle (empty when imported), those calls' pickles and the first one's number among the map's
    items; :class:`Refused` for an index it does not hold. A job of no array (``index`` None) makes
    the calls of a file that holds one task's (``fleet.Executor.map``'s chunks)."""
    try:
        chunked = data.startswith(CHUNKS_MAGIC)
        header, payload = unpack(CHUNKS_MAGIC if chunked else CALLS_MAGIC, data)
        size, ends = int(header["function"]), [int(e) for e in header["ends"]]
        each, offset = int(header.get("chunksize", 1)), int(header.get("first", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(f"the map's calls cannot be read: {exc}") from None
    tasks = -(-len(ends) // max(each, 1))
    if index is None and chunked and tasks == 1:
        index = 0
    if index is None:
        raw = os.environ.get("FLEET_ARRAY_INDEX", "")
        raise Refused(f"FLEET_ARRAY_INDEX {raw!r}: a map's call runs as a task of its job array")
    if not 0 <= index < tasks:
        raise Refused(f"FLEET_ARRAY_INDEX {index}: the map holds tasks 0 to {tasks - 1}")
    first, last = index * each, min(index * each + each, len(ends))
    starts = [size + (ends[i - 1] if i else 0) for i in range(first, last)]
    calls = [payload[start : size + ends[i]] for start, i in zip(starts, range(first, last), strict=True)]
    return header, payload[:size], calls, offset + first


def outcome_entry(outcome: bytes) -> bytes:
    """One call's outcome as a ``fleet-outcomes 1`` file holds it: its length, a newline, itself."""
    return b"%d\n" % len(outcome) + outcome


def read_outcomes(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """A task's outcomes (:func:`outcome_entry`'s): the header and each call's outcome, as many as
    ended whole; ``ValueError`` for anything else."""
    header, payload = unpack(OUTCOMES_MAGIC, data)
    if not isinstance(header.get("first"), int) or not isinstance(header.get("calls"), int):
        raise ValueError("its header names no first call and count")
    entries: list[bytes] = []
    at = 0
    while (end := payload.find(b"\n", at, at + 21)) > at and payload[at:end].isdigit():
        size = int(payload[at:end])
        if len(payload) < end + 1 + size:
            break  # the task was killed while it wrote this one
        entries.append(payload[end + 1 : end + 1 + size])
        at = end + 1 + size
    return header, entries


def status(outcome: bytes) -> str:
    """What one call's outcome (``fleet-outcome 1``, as the runner wrote it) says of the call."""
    line = outcome[len(OUTCOME_MAGIC) : outcome.find(b"\n", len(OUTCOME_MAGIC))]
    return str(json.loads(line).get("status", ""))
