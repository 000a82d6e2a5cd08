"""The host side of the checkpoint contract (the writer side is the ``fleet_worker`` SDK).

A job's checkpoints live in ``<checkpoint_root>/<job id>/``, a directory the agent (root) creates
and gives to the job's user with mode 0700, or, where the node has the storage group (the API's,
``storage_group``), to the job's user and that group with mode 2750: the API reads what the job
writes there (``fleet download --checkpoint``), as new files take the directory's group. The root
itself is 0711, so a job reaches its own directory but no job can list the others'. The SDK writes
each checkpoint under a temporary name, renames it into place, then replaces the ``latest`` marker:
the checkpoint's file name and, on a second line, the attempt that wrote it. Before each attempt the
agent writes ``.fleet-attempt`` (the attempt number); the SDK refuses to save when that number is
past its own, so a stale attempt cannot move ``latest`` once a newer one exists.

Everything in the directory is the job's to write, so the agent reads it as hostile input: no
symlink is followed (``O_NOFOLLOW`` and ``lstat`` under a directory fd), nothing outside the
directory is named, the marker is read only up to a small cap and only if it is a regular file.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from fleet.models import check_job_id

MARKER = "latest"
ATTEMPT_FILE = ".fleet-attempt"
_MARKER_MAX = 4096
#: a checkpoint is one file name inside the job's directory
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")


@dataclass(frozen=True)
class Marker:
    name: str
    attempt: int


def job_dir(root: Path, job_id: str) -> Path:
    """The job's directory; ``job_id`` is validated again here because it becomes a path."""
    return root / check_job_id(job_id)


def prepare(
    root: Path, job_id: str, attempt: int, uid: int | None, gid: int | None, shared: int | None = None
) -> Path:
    """Create the job's directory (0700, owned by the job's user), record ``attempt`` in it; with
    ``shared`` (the storage group's gid) the directory is that group's instead, 2750.

    ``uid``/``gid`` None: leave ownership as is (an agent that is not root cannot change it).
    """
    traversable(root)
    directory = job_dir(root, job_id)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    fd = _open_dir(directory)
    try:
        if uid is not None or shared is not None:
            group = shared if shared is not None else gid
            os.fchown(fd, uid if uid is not None else -1, group if group is not None else -1)
        os.fchmod(fd, 0o2750 if shared is not None else 0o700)
        _replace_file(fd, ATTEMPT_FILE, f"{attempt}\n".encode())
    finally:
        os.close(fd)
    return directory


def traversable(folder: Path) -> None:
    """Make ``folder`` (and what is missing above it) mode 0711: anyone may pass through it to a
    name they know, only its owner may list it. A folder this process may not chmod (another user's,
    or root squashed on NFS) keeps its mode: what lies in it keeps its own."""
    folder.mkdir(mode=0o711, parents=True, exist_ok=True)
    if stat.S_IMODE(folder.stat().st_mode) != 0o711:
        with contextlib.suppress(PermissionError):
            folder.chmod(0o711)


def latest(directory: Path) -> str | None:
    """Name of the latest complete checkpoint in ``directory``, or None."""
    marker = read_marker(directory)
    return marker.name if marker else None


def read_marker(directory: Path) -> Marker | None:
    """The ``latest`` marker, if it is sane and names a regular file in ``directory``."""
    try:
        fd = _open_dir(directory)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    try:
        text = _read_capped(fd, MARKER)
        if text is None:
            return None
        name, _, rest = text.partition("\n")
        name, attempt = name.strip(), rest.strip().split("\n")[0].strip()
        if not _FILE_NAME.match(name) or not _is_regular(fd, name):
            return None
        return Marker(name, int(attempt) if attempt.isdigit() else 0)
    finally:
        os.close(fd)


def _open_dir(directory: Path) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _read_capped(dir_fd: int, name: str) -> str | None:
    try:
        # O_NONBLOCK: a FIFO planted as the marker must not hang the agent
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MARKER_MAX).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _is_regular(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _replace_file(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` under ``dir_fd`` by rename: a symlink the job planted is replaced, not followed."""
    tmp = f".{name}.agent-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
