"""Where a job's kept outputs live on the checkpoint storage, and how they are read back.

When an attempt ends, the agent copies the spec's ``outputs`` directory (relative to the job's
working directory) to ``<checkpoint_root>/.fleet-outputs/<tenant>/<job id>/files/``, beside the
job's checkpoints in ``<checkpoint_root>/<job id>/`` (:mod:`fleet.agent.outputs`), with a small
``kept.json`` (the attempt, its bytes and files). The latest attempt's replace the earlier ones, the
tenant's jobs together hold at most its outputs quota, and every agent's checkpoint sweep removes
them with the job (``job_retention_s``). ``.fleet-outputs`` is root's and the storage group's
(``storage_group``, the API's: directories 0750, files 0640), or root's alone (0700, 0600) on a node
without that group: no job reads it, not even its own outputs. The API (``fleet download``) reads
it as a member of that group (``fleet install api``), or as root.

Both directions read what a job wrote as hostile input: nothing is followed through a symbolic link
(``O_NOFOLLOW``, ``lstat`` under directory fds), only directories and regular files are read, and
a path a user sends is checked (:func:`fleet.models.relative_path`) before it names anything.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleet.models import check_job_id

OUTPUTS = ".fleet-outputs"
FILES = "files"
META = "kept.json"
#: a tenant's name, as the models allow it (it becomes a directory here)
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
#: bytes read and written at a time
CHUNK = 1 << 20
_META_MAX = 4096


@dataclass(frozen=True)
class Kept:
    """What is kept of one job's outputs."""

    attempt: int
    bytes: int
    files: int


def storage_gid(group: str) -> int | None:
    """The gid of ``group`` (``storage_group``) where kept outputs and checkpoints are given to it;
    None where they stay root's alone: no group named, none of that name here, or this process is
    not root (it may not give a file to a group it is not in)."""
    if not group or os.geteuid() != 0:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def share(fd: int, gid: int | None, mode: int) -> None:
    """Give the open file or directory ``fd`` to the storage group ``gid`` with ``mode`` (0750 a
    directory, 0640 a file); with no group, ``mode`` without the group's bits (root's alone)."""
    if gid is not None:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, mode if gid is not None else mode & 0o7700)


def tenant_dir(root: Path, tenant: str) -> Path:
    if not _TENANT.match(tenant):
        raise ValueError(f"tenant {tenant!r} cannot name a directory")
    return root / OUTPUTS / tenant


def kept_dir(root: Path, tenant: str, job_id: str) -> Path:
    """The job's kept outputs; the id is checked again here because it becomes a path."""
    return tenant_dir(root, tenant) / check_job_id(job_id)


def open_dir(path: Path | str, dir_fd: int | None = None) -> int:
    """A directory's fd, never through a link at its last part."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)


def open_under(top: int, relative: str) -> int:
    """The fd of ``relative`` (checked already) under the directory fd ``top``, walked one part at a
    time without following any link; ``OSError`` when a part is missing, a link or not a directory."""
    fd = os.dup(top)
    for part in [p for p in relative.split("/") if p]:
        try:
            inner = open_dir(part, fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


def read_kept(folder: Path) -> Kept | None:
    """``kept.json`` of a job's kept outputs; None when there is none (or it is not sane)."""
    try:
        fd = os.open(folder / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, _META_MAX))
        return Kept(int(data["attempt"]), int(data["bytes"]), int(data["files"]))
    except (ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def usage(root: Path, tenant: str, but: str = "") -> int:
    """Bytes the tenant's jobs' kept outputs hold (all but job ``but``'s)."""
    try:
        entries = os.scandir(tenant_dir(root, tenant))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    total = 0
    with entries:
        for entry in entries:
            if entry.name != but and not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                kept = read_kept(Path(entry.path))
                total += kept.bytes if kept else 0
    return total


# -- reading back (the API) ------------------------------------------------------------------


class _Sink:
    """A file object tarfile writes to; what it wrote so far is taken in pieces."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def tar_tree(top: int, prefix: str, owner: int | None = None) -> Iterator[bytes]:
    """A gzipped tar of the tree under the directory fd ``top`` (closed at the end), its members
    named under ``prefix`` ("" for none), in pieces: directories and regular files only (links,
    devices and FIFOs are left out, never followed), and with ``owner``, only files that user owns."""
    sink = _Sink()
    with contextlib.closing(tarfile.open(fileobj=sink, mode="w|gz")) as tar:  # type: ignore[call-overload]
        yield from _add_tree(tar, sink, top, prefix, owner)
    yield sink.take()


def tar_file(fd: int, name: str) -> Iterator[bytes]:
    """A gzipped tar of the one open regular file ``fd`` (closed at the end), named ``name``."""
    sink = _Sink()
    with contextlib.closing(tarfile.open(fileobj=sink, mode="w|gz")) as tar:  # type: ignore[call-overload]
        yield from _add_file(tar, sink, fd, name)
    yield sink.take()


def open_file(top: int, name: str, owner: int | None) -> int | None:
    """The fd of ``name`` in the directory fd ``top`` if it is a regular file (of ``owner``, when
    given: never a hard link to another user's file), checked on the fd; else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=top)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (owner is not None and info.st_uid != owner):
        os.close(fd)
        return None
    return fd


def _add_file(tar: tarfile.TarFile, sink: _Sink, fd: int, name: str) -> Iterator[bytes]:
    with os.fdopen(fd, "rb") as source:
        info = tarfile.TarInfo(name)
        info.size, info.mode = os.fstat(fd).st_size, 0o644
        tar.addfile(info, _Exactly(source, info.size))
    yield sink.take()


def _add_tree(tar: tarfile.TarFile, sink: _Sink, top: int, prefix: str, owner: int | None) -> Iterator[bytes]:
    try:
        names = sorted(os.listdir(top))
        for name in names:
            path = f"{prefix}/{name}" if prefix else name
            try:
                mode = os.stat(name, dir_fd=top, follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                try:
                    inner = open_dir(name, top)
                except OSError:
                    continue
                info = tarfile.TarInfo(path)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                yield from _add_tree(tar, sink, inner, path, owner)
            elif stat.S_ISREG(mode) and (fd := open_file(top, name, owner)) is not None:
                yield from _add_file(tar, sink, fd, path)
    finally:
        os.close(top)


class _Exactly:
    """A file read for tarfile, which wants exactly the size its header said: a file that grew since
    is cut there, one that shrank is padded with zeros (kept outputs do not change; a checkpoint of a
    running job may)."""

    def __init__(self, source: object, size: int) -> None:
        self.source, self.left = source, size

    def read(self, size: int = -1) -> bytes:
        want = self.left if size < 0 else min(size, self.left)
        data = self.source.read(want)  # type: ignore[attr-defined]
        data = data + b"\0" * (want - len(data))
        self.left -= len(data)
        return bytes(data)
