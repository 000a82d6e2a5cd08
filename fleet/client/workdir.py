"""The client's half of shipping a directory with a job (:mod:`fleet.workdir` has the whole story):
pack it into a deterministic tar.gz (sorted, no times or owners, so an unchanged directory packs to
the same bytes and is not uploaded again), without ``.git/`` and what ``.gitignore`` or
``.fleetignore`` name; a link leading out of the directory is refused here, at submit.

An unchanged directory is not even packed again: :func:`ship` keeps, in the user's cache
(:mod:`fleet.client.cache`), the digest of the last archive packed from each directory against a
hash of its listing (every file's name, size, mtime, ctime, inode and mode). When the listing is
the same, the digest is the same, and the fleet is only asked whether it still holds it. As with
git's index and rsync's quick check, a file rewritten with other content but the same size and
times (an mtime set back by hand) is taken for unchanged; a file changed within a second of being
packed is never taken on trust (the cache keeps nothing from that pack).
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import posixpath
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from fleet.client import cache
from fleet.errors import SpecError
from fleet.workdir import IGNORE_FILES, MAX_BYTES, digest_of, outside, within

#: ``progress(step, done, total)``: ``("pack", bytes read, bytes in all)`` while packing, then
#: ``("upload", 0, bytes packed)`` before the upload and ``("upload", n, n)`` after it
Progress = Callable[[str, int, int], None]
#: gzip's level: 6, gzip's own default, packs source trees within a few percent of 9 in half the time
COMPRESS_LEVEL = 6
#: a file whose mtime is this close to the scan (or after it) might change again unseen
RACY_NS = 1_000_000_000
#: a ustar header after the link name: magic and version, empty owner names, device numbers and
#: prefix, and the padding to 512 bytes
_USTAR_TAIL = b"ustar\x0000" + bytes(32 + 32 + 8 + 8 + 155 + 12)
#: what a listing's hash starts with: another way of packing must not take this one's digests
_MANIFEST_FORMAT = f"fleet-workdir-manifest 1 gzip {COMPRESS_LEVEL}\n".encode()


def _patterns(root: Path) -> list[str]:
    patterns = []
    for name in IGNORE_FILES:
        path = root / name
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("!"):
                raise SpecError(
                    f"{path}: {line!r}: negated patterns are not supported; list what to leave out"
                )
            patterns.append(line)
    return patterns


def _ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        p = pattern.rstrip("/")
        if dir_only and not is_dir:
            continue
        if p.startswith("/") or "/" in p:
            if fnmatch.fnmatchcase(rel, p.lstrip("/").replace("**/", "*")):
                return True
        elif fnmatch.fnmatchcase(name, p):
            return True
    return False


class Entry(NamedTuple):
    """A file or link to ship: its name in the archive, its path here, its ``lstat``, a link's target."""

    rel: str
    path: str
    stat: os.stat_result
    link: str | None


class Tree(NamedTuple):
    """What a directory ships, found by :func:`scan` (nothing read but names and ``lstat``)."""

    root: Path
    entries: list[Entry]
    #: when the scan began (ns): a file changed since, or in the same clock tick before, is racy
    started_ns: int

    @property
    def size(self) -> int:
        return sum(e.stat.st_size for e in self.entries if e.link is None)

    def manifest(self) -> str:
        """A hash of every entry's name, size, times, inode and mode (a link's target too): what the
        cache takes an unchanged tree by, as git's index and rsync's quick check do."""
        digest = hashlib.sha256(_MANIFEST_FORMAT)
        for rel, _, st, link in self.entries:
            fields = (rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode)
            digest.update(
                ("\0".join(map(str, fields)) + f"\0{link or ''}\n").encode(errors="surrogateescape")
            )
        return digest.hexdigest()

    def settled(self) -> bool:
        """Whether no entry changed within :data:`RACY_NS` of the scan: only then may the cache take
        it (a file written again in the same clock tick would keep its size and mtime)."""
        return all(e.stat.st_mtime_ns < self.started_ns - RACY_NS for e in self.entries)


def scan(root: str | Path, max_bytes: int = MAX_BYTES) -> Tree:
    """The files and links the directory ships, in archive order (each folder's files by name, then
    its folders by name), without what its ignore files name; a link leading out is refused here."""
    base = Path(root)
    if not base.is_dir():
        raise SpecError(f"workdir {str(root)!r}: not a directory")
    started = time.time_ns()
    walk = _Walk(base, [".git/", *_patterns(base)], max_bytes, str(root))
    walk.folder(str(base), "")
    return Tree(base, walk.entries, started)


class _Walk:
    def __init__(self, base: Path, patterns: list[str], max_bytes: int, shown: str) -> None:
        self.base, self.patterns, self.max_bytes, self.shown = base, patterns, max_bytes, shown
        self.entries: list[Entry] = []
        self.total = 0

    def folder(self, path: str, rel_dir: str) -> None:
        with os.scandir(path) as found:
            items = sorted(found, key=lambda e: e.name)
        dirs = []
        for item in items:
            rel = _join(rel_dir, item.name)
            if item.is_symlink():
                if _ignored(rel, True, self.patterns) or _ignored(rel, False, self.patterns):
                    continue
                _check_link(self.base, rel, Path(item.path), self.shown)
                self._add(Entry(rel, item.path, item.stat(follow_symlinks=False), os.readlink(item.path)))
            elif _is_dir(item):
                if not _ignored(rel, True, self.patterns):
                    dirs.append((item.path, rel))
            elif item.is_file(follow_symlinks=False) and not _ignored(rel, False, self.patterns):
                self._add(Entry(rel, item.path, item.stat(follow_symlinks=False), None))
        for path, rel in dirs:
            self.folder(path, rel)

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.total += entry.stat.st_size
        if self.total > self.max_bytes:
            raise SpecError(
                f"workdir {self.shown!r}: more than {self.max_bytes >> 20} MiB to ship (at {entry.rel}); "
                "leave data, checkpoints and environments out with a .fleetignore (or .gitignore), or "
                "mount them"
            )


def _is_dir(item: os.DirEntry[str]) -> bool:
    try:
        return item.is_dir(follow_symlinks=False)
    except OSError:
        return False


def pack(root: str | Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The directory as a deterministic tar.gz, without what its ignore files name."""
    return archive(scan(root, max_bytes))


def archive(tree: Tree, progress: Callable[[int, int], None] | None = None) -> bytes:
    """The tree's entries as a deterministic tar.gz: in order, no times or owners, modes 0755 or 0644,
    a file another entry names by inode a hard link to it (what ``tarfile``'s ``add`` writes, in PAX
    format, with none of its per-member copying, owner look-ups and small writes: the tar is built
    in memory and compressed in one call). ``progress(done, total)``: bytes read."""
    parts: list[bytes] = []
    seen: dict[tuple[int, int], str] = {}
    done, total, written = 0, tree.size, 0
    for rel, path, st, link in tree.entries:
        info = tarfile.TarInfo(rel)
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644  # what tarfile.TarInfo's defaults leave
        inode = (st.st_ino, st.st_dev)
        content = b""
        if link is not None:
            info.type, info.linkname = tarfile.SYMTYPE, link
        elif st.st_nlink > 1 and inode in seen:
            info.type, info.linkname = tarfile.LNKTYPE, seen[inode]
        else:
            seen.setdefault(inode, rel)
            with open(path, "rb") as file:
                content = file.read()
            info.size = len(content)
        header = _header(rel, info.mode, info.size, info.type, info.linkname)
        parts.append(header or info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        parts.append(content)
        parts.append(bytes(-len(content) % tarfile.BLOCKSIZE))
        done += len(content)
        written += len(parts[-3]) + len(content) + len(parts[-1])
        if progress is not None:
            progress(done, total)
    end = written + 2 * tarfile.BLOCKSIZE  # two empty blocks, then a whole record, as tarfile ends one
    parts.append(bytes(2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE))
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=COMPRESS_LEVEL) as zipped:
        zipped.write(b"".join(parts))
    return buffer.getvalue()


def _header(name: str, mode: int, size: int, kind: bytes, link: str) -> bytes | None:
    """The ustar header ``tarfile`` writes in PAX format for a member needing no PAX record (an ASCII
    name and link of at most 100 bytes, no owner, time 0), built at a tenth of its cost; None for
    any other member (``TarInfo.tobuf`` writes those)."""
    try:
        name_b, link_b = name.encode("ascii"), link.encode("ascii")
    except UnicodeEncodeError:
        return None
    if len(name_b) > 100 or len(link_b) > 100 or size >= 8**11:
        return None
    block = b"".join(
        (
            name_b.ljust(100, b"\0"),
            b"%07o\0" % mode,
            b"0000000\0" * 2,  # uid, gid
            b"%011o\0" % size,
            b"00000000000\0",  # mtime
            b" " * 8,  # the checksum, as spaces while it is summed
            kind,
            link_b.ljust(100, b"\0"),
            _USTAR_TAIL,
        )
    )
    return block[:148] + b"%06o\0" % sum(block) + block[155:]


def _join(folder: str, name: str) -> str:
    return name if folder in ("", ".") else f"{folder}/{name}"


def _check_link(base: Path, rel: str, path: Path, root: str | Path) -> None:
    """A link is shipped as a link only when it stays inside the directory: refused otherwise, at
    submit, since no node could follow it (``data -> /datasets/x``)."""
    target = os.readlink(path)
    if target.startswith("/"):
        why = "a link to an absolute path"
    elif outside(posixpath.join(posixpath.dirname(rel), target)):
        why = "a link out of the directory"
    elif not within(os.path.realpath(path), os.path.realpath(base)):
        why = "a link that leads out of the directory through another link"
    else:
        return
    raise SpecError(
        f"workdir {str(root)!r}: {rel!r} is {why} ({target!r}), which cannot be shipped: leave it out with "
        f"a line '{rel}' in {Path(root) / '.fleetignore'}, or mount what it points to into the job "
        f"(--mount {os.path.realpath(path)}:/data, a spec's mounts; under the operator's allowed_mounts) "
        "and read it there"
    )


class Shipped(NamedTuple):
    """What :func:`ship` did: the digest, what the directory holds, and what it cost."""

    digest: str
    files: int
    size: int
    #: the archive's size; None when the cache knew its digest (nothing packed)
    packed: int | None
    uploaded: bool


def ship(
    root: str | Path,
    holds: Callable[[str], bool],
    put: Callable[[str, bytes], None],
    max_bytes: int = MAX_BYTES,
    progress: Progress | None = None,
) -> Shipped:
    """Make sure the fleet holds the directory's archive: pack it unless the cache knows the digest
    of an unchanged listing and the fleet still ``holds`` it; ``put`` it unless the fleet holds it."""
    tree = scan(root, max_bytes)
    manifest = tree.manifest()
    known = cache.get("workdirs", _key(tree.root), manifest)
    if known is not None and holds(known):
        return Shipped(known, len(tree.entries), tree.size, None, False)
    data = archive(tree, None if progress is None else lambda done, total: progress("pack", done, total))
    digest = digest_of(data)
    uploaded = not holds(digest)
    if uploaded:
        if progress is not None:
            progress("upload", 0, len(data))
        put(digest, data)
        if progress is not None:
            progress("upload", len(data), len(data))
    if tree.settled():
        cache.put("workdirs", _key(tree.root), manifest, digest)
    return Shipped(digest, len(tree.entries), tree.size, len(data), uploaded)


def _key(root: Path) -> str:
    """The cache's name for a directory: its real path, hashed (no path of the user's in a file name)."""
    return hashlib.sha256(os.path.realpath(root).encode(errors="surrogateescape")).hexdigest()[:32]
