"""Atomic checkpoints: write to a temporary name, fsync, rename into place, then move ``latest``.

A crash at any point leaves either the previous checkpoint or the new one as ``latest``, never a
half-written file. Files are named ``step-<step>.ckpt``; the newest ``keep`` are kept.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

MARKER = "latest"


def checkpoint_dir() -> Path:
    """``$FLEET_CHECKPOINT_DIR``, or ``./checkpoints`` outside fleet."""
    path = Path(os.environ.get("FLEET_CHECKPOINT_DIR", "checkpoints"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _dump(state: Any) -> bytes:
    buffer = io.BytesIO()
    try:
        import torch

        torch.save(state, buffer)
    except ImportError:
        pickle.dump(state, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def _load(data: bytes) -> Any:
    try:
        import torch

        return torch.load(io.BytesIO(data), weights_only=False)
    except ImportError:
        return pickle.loads(data)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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


def save(state: Any, step: int, keep: int = 2) -> Path:
    """Checkpoint ``state`` as of ``step`` and make it the latest; return its path."""
    folder = checkpoint_dir()
    path = folder / f"step-{step:010d}.ckpt"
    _write_atomic(path, _dump({"step": step, "state": state}))
    _write_atomic(folder / MARKER, f"{path.name}\n".encode())
    for old in sorted(folder.glob("step-*.ckpt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_name() -> str | None:
    try:
        return (checkpoint_dir() / MARKER).read_text().strip() or None
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
