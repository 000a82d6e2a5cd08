"""The host side of the checkpoint contract (the writer side is the ``fleet_worker`` SDK).

A job's checkpoints live in ``<checkpoint_root>/<job id>/``. The SDK writes each checkpoint under
a temporary name, renames it into place, then replaces the ``latest`` marker, a one-line file
holding the checkpoint's name relative to that directory. A crash therefore never leaves a half
checkpoint as the latest.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "latest"


def job_dir(root: Path, job_id: str) -> Path:
    return root / job_id


def latest(directory: Path) -> str | None:
    """Name of the latest complete checkpoint in ``directory``, or None."""
    try:
        name = (directory / MARKER).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not name or name.startswith("/") or ".." in Path(name).parts or not (directory / name).exists():
        return None
    return name
