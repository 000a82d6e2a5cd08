"""Unpack what ``fleet download`` fetched (a gzipped tar of a job's kept outputs, or of one
checkpoint) into a local directory, safely whatever the archive holds.

Only directories and regular files are unpacked; a member that is absolute, holds ``..``, or is a
link, a device or a FIFO is refused, naming it. Everything is unpacked into a new temporary
directory inside the destination first, then moved into place: nothing is written through a link
that was there (a file is renamed over a name, never opened through it; a folder of the archive
never lands under a link), and an existing file is replaced only with ``force``: without it the
download is refused before anything is moved, naming the first file in the way.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import IO

from fleet.errors import FleetError, SpecError
from fleet.models import relative_path
from fleet.workdir import NotAFolder, parent_folder


class Exists(SpecError):
    """A file of the download is there already (and ``force`` was not given)."""


def unpack(stream: IO[bytes], dest: Path, *, force: bool = False) -> list[str]:
    """Unpack the gzipped tar read from ``stream`` into ``dest`` (made if missing); the files it
    wrote, relative to ``dest``, in order."""
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fleet-download-", dir=dest))
    try:
        names = _extract(stream, tmp)
        for name in names:
            _folders(dest, name, make=False)
            if not force and os.path.lexists(dest / name):
                raise Exists(
                    f"{dest / name} exists: give --force (force=True) to replace it, or another "
                    "destination (-o DIR)"
                )
        for name in names:
            _move(tmp / name, dest, name)
        return names
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(stream: IO[bytes], into: Path) -> list[str]:
    files: list[str] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|gz") as tar:
            for member in tar:
                try:
                    name = relative_path(member.name, "give the archive the API sends")
                except ValueError as exc:
                    raise SpecError(f"download: member {member.name!r} refused: {exc}") from None
                if not name:
                    continue
                path = into / name
                if member.isdir():
                    path.mkdir(parents=True, exist_ok=True)
                elif member.isreg():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                    try:
                        fd = os.open(path, flags, 0o644)
                    except FileExistsError:
                        raise SpecError(f"download: member {member.name!r} given twice") from None
                    with os.fdopen(fd, "wb") as out, source:
                        shutil.copyfileobj(source, out)
                    files.append(name)
                else:
                    raise SpecError(f"download: member {member.name!r} is not a file or directory: refused")
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise FleetError(f"download: the archive the API sent cannot be read: {exc}") from None
    return files


def _folders(dest: Path, name: str, make: bool) -> Path:
    """The folder ``dest/name`` goes in (:func:`fleet.workdir.parent_folder`); :class:`SpecError`
    naming a part that is a link or a file."""
    try:
        return parent_folder(dest, name, make)
    except NotAFolder as found:
        raise SpecError(
            f"{found.folder} is a link or a file, not a folder: move it away, or download elsewhere"
        ) from None


def _move(source: Path, dest: Path, name: str) -> None:
    """``source`` to ``dest/name``, its folders made where missing and never entered through a link."""
    target = _folders(dest, name, make=True) / name.rsplit("/", 1)[-1]
    if target.is_dir() and not target.is_symlink():
        raise SpecError(f"{target} is a folder; the download has a file there: move it away")
    os.replace(source, target)  # replaces a link there, never writes through it
