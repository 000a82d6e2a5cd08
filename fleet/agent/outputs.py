"""Keep a job's outputs when an attempt ends (any end): the node side of :mod:`fleet.outputs`.

The attempt's working directory is the job's: whatever is in it may have been planted to make root
read or write something else. So the copy works on directory fds only and follows nothing: a
symbolic link is left out (never dereferenced, never copied), as are devices, FIFOs and sockets; a
file is read only if it is a regular file owned by whoever owns the working directory (the job's
user), checked on the open fd, so a hard link to a file of root's is not read; names come from the
directory listing, so nothing a job names becomes a path outside its own storage. What is kept is
root's and the storage group's (the API's: directories 0750, files 0640), root's alone where the node
has no such group (:func:`fleet.outputs.storage_gid`). The copy is built
under a temporary name and renamed into place; a copy that would take the tenant past its outputs
quota is dropped whole (the earlier attempt's stay), and the job says so. It never fails the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleet.outputs import (
    CHUNK,
    FILES,
    META,
    Kept,
    kept_dir,
    open_dir,
    open_under,
    share,
    storage_gid,
    tenant_dir,
    usage,
)
from fleet.text import nbytes

#: most files (and directories) one attempt's outputs may hold, and how deep they may nest
MAX_FILES = 100_000
MAX_DEPTH = 64


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt's outputs: ``kept`` (None: nothing new kept) and a note for the job."""

    kept: Kept | None
    note: str = ""


class _Over(Exception):
    """More than the quota, or than MAX_FILES."""


class _Copy:
    def __init__(self, budget: int, owner: int, gid: int | None) -> None:
        self.budget, self.owner, self.gid = budget, owner, gid
        self.bytes = self.files = self.skipped = 0

    def tree(self, src: int, dst: int, depth: int) -> None:
        for name in sorted(os.listdir(src)):
            try:
                mode = os.stat(name, dir_fd=src, follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode) and depth < MAX_DEPTH:
                self._count()
                try:
                    inner = open_dir(name, src)
                except OSError:  # swapped for a link meanwhile
                    self.skipped += 1
                    continue
                try:
                    os.mkdir(name, 0o700, dir_fd=dst)
                    out = open_dir(name, dst)
                    try:
                        share(out, self.gid, 0o750)
                        self.tree(inner, out, depth + 1)
                    finally:
                        os.close(out)
                finally:
                    os.close(inner)
            elif stat.S_ISREG(mode):
                self._file(src, dst, name)
            else:  # a link, a device, a FIFO, a socket; or nested too deep
                self.skipped += 1

    def _count(self) -> None:
        self.files += 1
        if self.files > MAX_FILES:
            raise _Over(f"more than {MAX_FILES} files")

    def _file(self, src: int, dst: int, name: str) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
        except OSError:
            self.skipped += 1
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != self.owner:
                self.skipped += 1  # swapped meanwhile, or not the job's own file (a hard link)
                return
            self._count()
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst)
            share(out, self.gid, 0o640)
            with os.fdopen(out, "wb") as sink:
                while data := os.read(fd, CHUNK):
                    self.bytes += len(data)
                    if self.bytes > self.budget:
                        raise _Over("over quota")
                    sink.write(data)
        finally:
            os.close(fd)


def keep(
    work: Path,
    relative: str,
    root: Path,
    tenant: str,
    job_id: str,
    attempt: int,
    quota: int | Callable[[], int],
    group: str = "",
) -> Outcome:
    """Copy ``work/relative`` (the attempt's outputs; ``relative`` checked at submit) to the job's kept
    outputs under ``root``, replacing an earlier attempt's, if the tenant's kept outputs stay within
    ``quota`` bytes (or what ``quota()`` reads, only once there is something to keep); readable by
    ``group`` (``storage_group``) where it exists. Nothing there (or not a directory): nothing new
    kept, no note."""
    try:
        top = open_dir(work)
    except OSError:
        return Outcome(None)
    try:
        owner = os.fstat(top).st_uid
        try:
            src = open_under(top, relative)
        except OSError:
            return Outcome(None)
    finally:
        os.close(top)
    try:
        limit = quota if isinstance(quota, int) else quota()
        return _keep(src, owner, root, tenant, job_id, attempt, limit, relative, storage_gid(group))
    finally:
        os.close(src)


def _keep(
    src: int,
    owner: int,
    root: Path,
    tenant: str,
    job_id: str,
    attempt: int,
    quota: int,
    relative: str,
    gid: int | None,
) -> Outcome:
    folder = tenant_dir(root, tenant)
    tmp = folder / f".{job_id}.{attempt}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for made in (root / ".fleet-outputs", folder, tmp, tmp / FILES):  # made here, or by an older one
        with contextlib.suppress(FileExistsError):
            os.mkdir(made, 0o700)
        fd = open_dir(made)
        try:
            share(fd, gid, 0o750)
        finally:
            os.close(fd)
    used = usage(root, tenant, but=job_id)
    copy = _Copy(max(quota - used, 0), owner, gid)
    try:
        out = open_dir(tmp / FILES)
        try:
            copy.tree(src, out, 0)
        finally:
            os.close(out)
    except _Over as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        why = (
            str(exc)
            if copy.files > MAX_FILES
            else f"tenant {tenant}'s kept outputs may hold {nbytes(quota)} and its other jobs' "
            f"hold {nbytes(used)}"
        )
        return Outcome(None, f"outputs of attempt {attempt} not kept ({relative}/): {why}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    kept = Kept(attempt, copy.bytes, copy.files)
    meta = os.open(tmp / META, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    share(meta, gid, 0o640)
    with os.fdopen(meta, "w") as sink:
        sink.write(json.dumps({"attempt": attempt, "bytes": kept.bytes, "files": kept.files}))
    _swap(tmp, kept_dir(root, tenant, job_id))
    note = f"{copy.skipped} links, devices or files not the job's own left out" if copy.skipped else ""
    return Outcome(kept, note)


def _swap(new: Path, target: Path) -> None:
    """``new`` in place of ``target``: the earlier copy is moved aside first, then removed."""
    old = target.with_name(f".{target.name}.{os.getpid()}.old.tmp")
    with contextlib.suppress(FileNotFoundError):
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)
