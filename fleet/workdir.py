"""Ship a directory with a job: pack it (client: :mod:`fleet.client.workdir`), keep it by content
(Redis), unpack it (agent: here).

``fleet submit --workdir . -- python train.py``: the client packs the directory into a
deterministic tar.gz (sorted, no times or owners, so an unchanged directory packs to the same
bytes), names it by its SHA-256, and uploads it only if the fleet does not hold it yet. The job's
spec carries ``workdir: sha256:<hex>``. The agent fetches it once per node, checks the hash,
unpacks it member by member (:func:`unpack`: no absolute paths, no ``..``, no links out, no devices,
no set-id bits, nothing written through a link; the same checks on every Python fleet runs on,
whether or not its tarfile has the ``data`` filter) into ``state_dir/workdirs/<hex>``, and each
attempt starts in a writable copy of its own (:mod:`fleet.agent.runtime.workspace`; the Docker
runtime mounts the copy as the container's working directory).

A symbolic link is shipped as a link when it stays inside the directory; one that is absolute or
leads out of it (``data -> /datasets/x``) is refused at submit, naming it and the fix (leave it out
with ``.fleetignore``, or mount the data), since it could not be followed on a node.

What is left out: ``.git/``, and what ``.gitignore`` or ``.fleetignore`` in the directory name,
in the common subset of gitignore's syntax (``name``, ``*.ext``, ``dir/``, ``/rooted``, ``a/**/b``;
``!negation`` is not supported and is refused, so nothing is shipped by surprise).
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fleet.errors import SpecError

T = TypeVar("T")

DIGEST = re.compile(r"^sha256:([0-9a-f]{64})\Z")
#: a packed directory larger than this is refused (settings: ``workdir_max_bytes``)
MAX_BYTES = 64 << 20
IGNORE_FILES = (".gitignore", ".fleetignore")
#: an unpacked directory holds at most this many entries
MAX_MEMBERS = 100_000
#: the name of a directory being unpacked: ``.<hex>.<random>.tmp`` in the workdirs folder
_TEMP = re.compile(r"^\.[0-9a-f]{64}\..+\.tmp\Z")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(value: str) -> str:
    """The hex of a ``sha256:<hex>`` digest; :class:`SpecError` otherwise."""
    match = DIGEST.match(value)
    if match is None:
        raise SpecError(
            f"workdir {value!r}: expected sha256:<64 hex digits> (the CLI and Client upload a "
            "directory and send its digest)"
        )
    return match.group(1)


def outside(relative: str) -> bool:
    """Whether a path relative to the directory's root leads out of it (lexically)."""
    normal = posixpath.normpath(relative)
    return normal == ".." or normal.startswith("../") or normal.startswith("/")


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def clean_temp(into: Path) -> list[str]:
    """Remove what unpacks left half done in ``into`` (an agent killed while unpacking); the names
    removed. Called by the agent at start, before any attempt unpacks."""
    removed = []
    try:
        entries = list(into.iterdir())
    except (FileNotFoundError, NotADirectoryError):  # nothing unpacked yet; or not a folder (the
        return []  # first unpack fails on it, saying so)
    for entry in entries:
        if _TEMP.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def unpack(data: bytes, digest: str, into: Path, max_bytes: int = MAX_BYTES) -> Path:
    """The directory for ``digest`` under ``into``, unpacked from ``data`` unless it is there already.

    The bytes must hash to the digest. Unpacked into a temporary directory of its own (a unique name,
    removed if anything fails) and renamed, so a crash never leaves a half tree under the final name
    and a failed unpack never stands in the way of the next; read-only for everyone but root.
    :class:`SpecError` for an archive that cannot be unpacked safely (see :func:`_extract`);
    ``OSError`` for a node that cannot write it (the node's fault, not the job's).
    """
    hexdigest = check_digest(digest)
    target = into / hexdigest
    if target.is_dir():
        return target
    if digest_of(data) != digest:
        raise SpecError(f"workdir {digest}: the stored bytes do not match their digest")
    into.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{hexdigest}.", suffix=".tmp", dir=into))
    try:
        tmp.chmod(0o755)
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                _extract(tar, tmp, max_bytes)
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise SpecError(f"workdir {digest}: cannot be unpacked: {exc}") from None
        except _Unsafe as exc:
            raise SpecError(f"workdir {digest}: cannot be unpacked safely: {exc}") from None
        try:
            tmp.rename(target)
        except OSError:  # another attempt unpacked it meanwhile
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def check_archive(data: bytes, max_bytes: int = MAX_BYTES) -> tuple[int, int]:
    """At upload, before a node unpacks it: a gzipped tar holding at most ``max_bytes`` of content and
    :data:`MAX_MEMBERS` entries (a 2 MiB upload unpacked to 2 GiB on every node and 600 KB of 100,000
    files delayed launches by minutes); :class:`SpecError` otherwise, naming the limit. Reads the
    headers in one pass, stopping at the first limit. Returns the bytes of content and the number
    of members that are not folders (files and links)."""
    content, count, files = 0, 0, 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar:
            for member in tar:
                count += 1
                files += not member.isdir()
                content += member.size if member.isreg() else 0
                if count > MAX_MEMBERS:
                    raise SpecError(
                        f"workdir: more than {MAX_MEMBERS} files and folders; leave some out "
                        "with a .fleetignore, or ship them as one archive"
                    )
                if content > max_bytes:
                    raise SpecError(
                        f"workdir: more than workdir_max_bytes ({max_bytes}) unpacked; leave "
                        "data, checkpoints and environments out with a .fleetignore"
                    )
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise SpecError(f"workdir: not a packed directory (tar.gz): {exc}") from None
    return content, files


class _Unsafe(Exception):
    """A member that would write outside the directory, or something that is not a plain file."""


def _extract(tar: tarfile.TarFile, dest: Path, max_bytes: int) -> None:
    """Unpack ``tar`` into the empty directory ``dest``, member by member, refusing (:class:`_Unsafe`)
    absolute names, ``..``, a member under a link, a link that is absolute or leads out of ``dest``
    (checked again once every member is there, so links made in any order cannot chain out),
    a hard link to anything but a file unpacked before it, devices and FIFOs, a name given twice,
    more than ``max_bytes`` of content or :data:`MAX_MEMBERS` entries. Nothing is opened through a
    link (``O_NOFOLLOW``, ``O_EXCL``). Modes: directories 0755, files 0755 or 0644 (executable by
    anyone if by anyone in the archive): no set-id or sticky bits, nothing writable by group or
    others. Owners and times from the archive are ignored."""
    out = _Extractor(tar, dest, max_bytes)
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise _Unsafe(f"more than {MAX_MEMBERS} entries")
        out.add(member)
    root = os.path.realpath(dest)
    for name in out.links:
        if not within(os.path.realpath(dest / name), root):
            raise _Unsafe(f"{name!r} leads out of the directory through another link")


class _Extractor:
    def __init__(self, tar: tarfile.TarFile, dest: Path, max_bytes: int) -> None:
        self.tar, self.dest, self.max_bytes, self.left = tar, dest, max_bytes, max_bytes
        self.files: set[str] = set()
        self.links: list[str] = []

    def add(self, member: tarfile.TarInfo) -> None:
        name = _member_name(member.name)
        if name is None:
            return  # the root itself ('.', './')
        path = _make_parents(self.dest, name) / name.rsplit("/", 1)[-1]
        if member.isdir():
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                raise _Unsafe(f"{member.name!r}: given twice")
            path.mkdir(exist_ok=True)
            path.chmod(0o755)  # whatever the umask
        elif member.isreg():
            self.left -= member.size
            if self.left < 0:
                raise _Unsafe(f"more content than the {self.max_bytes >> 20} MiB a workdir may hold")
            self._write(member, path)
            self.files.add(name)
        elif member.issym():
            self._symlink(member, name, path)
        elif member.islnk():
            source = _member_name(member.linkname)
            if source is None or source not in self.files:
                raise _Unsafe(
                    f"{member.name!r} is a hard link to {member.linkname!r}, which is not a file "
                    "unpacked before it"
                )
            _exclusive(member, os.link, self.dest / source, path, follow_symlinks=False)
            self.files.add(name)
        else:
            raise _Unsafe(f"{member.name!r} is not a file, directory or link (a device, FIFO or socket)")

    def _symlink(self, member: tarfile.TarInfo, name: str, path: Path) -> None:
        target = member.linkname
        if not target or "\x00" in target or target.startswith("/"):
            raise _Unsafe(f"{member.name!r} is a link to an absolute path ({target!r})")
        if outside(posixpath.join(posixpath.dirname(name), target)):
            raise _Unsafe(f"{member.name!r} is a link out of the directory ({target!r})")
        _exclusive(member, os.symlink, target, path)
        self.links.append(name)

    def _write(self, member: tarfile.TarInfo, path: Path) -> None:
        source = self.tar.extractfile(member)
        assert source is not None  # a regular file
        mode = 0o755 if member.mode & 0o111 else 0o644
        fd = _exclusive(member, os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out, source:
            shutil.copyfileobj(source, out)
            os.fchmod(fd, mode)


def _member_name(raw: str) -> str | None:
    """A member's name relative to the root, without ``.`` parts; None for the root itself."""
    if not raw or "\x00" in raw or raw.startswith("/"):
        raise _Unsafe(f"{raw!r} is an absolute path")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _Unsafe(f"{raw!r} leads out of the directory ('..')")
    return "/".join(parts) or None


class NotAFolder(Exception):
    """A part of a path to unpack into is a link or a file (see :func:`parent_folder`)."""

    def __init__(self, folder: Path, link: bool) -> None:
        super().__init__(f"{folder} is a {'link' if link else 'file'}")
        self.folder, self.link = folder, link


def parent_folder(dest: Path, name: str, make: bool = True, mode: int | None = None) -> Path:
    """The folder ``dest/name`` goes in, each part a folder never reached through a link: made
    where missing with ``make`` (then ``chmod mode``, whatever the umask, if given); a part that is
    a link or a file raises :class:`NotAFolder`. Unpacking a shipped directory and a download
    both walk it."""
    folder = dest
    for part in name.split("/")[:-1]:
        folder = folder / part
        try:
            found = folder.lstat().st_mode
        except FileNotFoundError:
            if make:
                folder.mkdir()
                if mode is not None:
                    folder.chmod(mode)
            continue
        if not stat.S_ISDIR(found):
            raise NotAFolder(folder, stat.S_ISLNK(found))
    return folder


def _make_parents(dest: Path, name: str) -> Path:
    """The directory ``name`` goes in, made where missing (0755); never reached through a link."""
    try:
        return parent_folder(dest, name, mode=0o755)
    except NotAFolder as found:
        kind = "link" if found.link else "file"
        raise _Unsafe(f"{name!r} is under a {kind} ({found.folder.name!r})") from None


def _exclusive(member: tarfile.TarInfo, make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``make(*args)``, which creates a name: one that exists already was given twice."""
    try:
        return make(*args, **kwargs)
    except FileExistsError:
        raise _Unsafe(f"{member.name!r}: given twice") from None
