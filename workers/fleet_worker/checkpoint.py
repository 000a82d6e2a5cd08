"""Atomic checkpoints: write to a temporary name, fsync, rename into place, then move ``latest``.

A crash at any point leaves either the previous checkpoint or the new one as ``latest``, never a
half-written file. Files are named ``step-<step>.ckpt``; the newest ``keep`` are kept.

Fenced by attempt: temporary names carry the attempt and a random part (pids repeat across
containers), the ``latest`` marker records the attempt that wrote it, and ``save`` refuses with
:class:`StaleAttempt` once the agent has started a newer attempt (``.fleet-attempt``) or a newer
attempt has written ``latest``, so a stale attempt never moves ``latest`` backwards.
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import sys
from pathlib import Path
from typing import Any

from fleet_worker.env import attempt

MARKER = "latest"
ATTEMPT_FILE = ".fleet-attempt"


class StaleAttempt(RuntimeError):
    """A newer attempt of this job exists: this one must not write checkpoints any more."""


def checkpoint_dir() -> Path:
    """``$FLEET_CHECKPOINT_DIR``, or ``./checkpoints`` outside fleet."""
    path = Path(os.environ.get("FLEET_CHECKPOINT_DIR", "checkpoints"))
    path.mkdir(parents=True, exist_ok=True)
    return path


#: what a file of ``torch.save`` starts with (a zip archive); any other checkpoint is a pickle
TORCH_MAGIC = b"PK\x03\x04"


def _dump(state: Any) -> bytes:
    """``torch.save`` when the job has imported torch (its state may hold tensors), else a pickle:
    a job that checkpoints a dict does not pay for importing torch (seconds of CPU)."""
    buffer = io.BytesIO()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.save(state, buffer)
    else:
        pickle.dump(state, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def _load(data: bytes) -> Any:
    """A checkpoint of either kind, by what it starts with."""
    if not data.startswith(TORCH_MAGIC):
        return pickle.loads(data)
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "this checkpoint was written with torch.save and torch is not installed here: install "
            "torch in the job's image, or resume from another checkpoint"
        ) from None
    return torch.load(io.BytesIO(data), weights_only=False)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{attempt()}-{os.getpid()}-{secrets.token_hex(4)}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _newest_attempt(folder: Path) -> int:
    """The highest attempt the agent started or that wrote ``latest`` (0 when unknown)."""
    found = 0
    for name, line in ((ATTEMPT_FILE, 0), (MARKER, 1)):
        try:
            lines = (folder / name).read_text().split("\n")
        except (FileNotFoundError, UnicodeDecodeError):
            continue
        value = lines[line].strip() if len(lines) > line else ""
        found = max(found, int(value) if value.isdigit() else 0)
    return found


def _check_current(folder: Path) -> None:
    mine, newest = attempt(), _newest_attempt(folder)
    if mine and newest > mine:
        raise StaleAttempt(f"attempt {mine} is stale: attempt {newest} of this job has started")


def save(state: Any, step: int, keep: int = 2) -> Path:
    """Checkpoint ``state`` as of ``step`` and make it the latest; return its path.

    Raises :class:`StaleAttempt` (and writes nothing) when a newer attempt of the job exists.
    """
    folder = checkpoint_dir()
    _check_current(folder)
    path = folder / f"step-{step:010d}.ckpt"
    _write_atomic(path, _dump({"step": step, "state": state}))
    _check_current(folder)  # the newer attempt may have started while this one was writing
    _write_atomic(folder / MARKER, f"{path.name}\n{attempt()}\n".encode())
    for old in sorted(folder.glob("step-*.ckpt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_name() -> str | None:
    try:
        return (checkpoint_dir() / MARKER).read_text().split("\n")[0].strip() or None
    except FileNotFoundError:
        return None


def load_latest() -> tuple[Any, int] | None:
    """``(state, step)`` of ``$FLEET_RESUME_FROM`` if set, else of the ``latest`` marker; None if none."""
    resume = os.environ.get("FLEET_RESUME_FROM")
    if resume:
        path = Path(resume)
    else:
        name = latest_name()
        if name is None:
            return None
        path = checkpoint_dir() / name
    if not path.exists():
        return None
    saved = _load(path.read_bytes())
    return saved["state"], int(saved["step"])
