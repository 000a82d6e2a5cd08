"""Ship a directory with a job: pack it (client), keep it by content (Redis), unpack it (agent).

``fleet submit --workdir . -- python train.py``: the client packs the directory into a
deterministic tar.gz (sorted, no times or owners, so an unchanged directory packs to the same
bytes), names it by its SHA-256, and uploads it only if the fleet does not hold it yet. The job's
spec carries ``workdir: sha256:<hex>``. The agent fetches it once per node, checks the hash,
unpacks it with tarfile's ``data`` filter (no absolute paths, no ``..``, no links out, no devices,
no set-id bits) into ``state_dir/workdirs/<hex>``, and each attempt starts in a copy of it
(process runtime) or with it mounted read-only as its working directory (Docker runtime).

What is left out: ``.git/``, and what ``.gitignore`` or ``.fleetignore`` in the directory name,
in the common subset of gitignore's syntax (``name``, ``*.ext``, ``dir/``, ``/rooted``, ``a/**/b``;
``!negation`` is not supported and is refused, so nothing is shipped by surprise).
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import re
import tarfile
from pathlib import Path

from fleet.errors import SpecError

DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
#: a packed directory larger than this is refused (settings: ``workdir_max_bytes``)
MAX_BYTES = 64 << 20
IGNORE_FILES = (".gitignore", ".fleetignore")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(value: str) -> str:
    """The hex of a ``sha256:<hex>`` digest; :class:`SpecError` otherwise."""
    match = DIGEST.match(value)
    if match is None:
        raise SpecError(f"workdir {value!r}: expected sha256:<64 hex digits> (the CLI and Client upload a "
                        "directory and send its digest)")  # fmt: skip
    return match.group(1)


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


def pack(root: str | Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The directory as a deterministic tar.gz, without what its ignore files name."""
    base = Path(root)
    if not base.is_dir():
        raise SpecError(f"workdir {str(root)!r}: not a directory")
    patterns = [".git/", *_patterns(base)]
    files: list[tuple[str, Path]] = []
    total = 0
    for folder, dirs, names in os.walk(base):
        here = Path(folder)
        rel_dir = here.relative_to(base).as_posix()
        dirs[:] = sorted(d for d in dirs if not _ignored(_join(rel_dir, d), True, patterns))
        for name in sorted(names):
            rel = _join(rel_dir, name)
            path = here / name
            if _ignored(rel, False, patterns) or not (path.is_file() or path.is_symlink()):
                continue
            files.append((rel, path))
            total += path.lstat().st_size
            if total > max_bytes:
                raise SpecError(
                    f"workdir {str(root)!r}: more than {max_bytes >> 20} MiB to ship (at {rel}); leave data, "
                    "checkpoints and environments out with a .fleetignore (or .gitignore), or mount them"
                )
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:  # fmt: skip
        for rel, path in files:
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if info.mode & 0o111 else 0o644
            if info.isreg():
                with path.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _join(folder: str, name: str) -> str:
    return name if folder in ("", ".") else f"{folder}/{name}"


def unpack(data: bytes, digest: str, into: Path) -> Path:
    """The directory for ``digest`` under ``into``, unpacked from ``data`` unless it is there already.

    The bytes must hash to the digest. Unpacked into a temporary name and renamed, so a crash never
    leaves a half tree under the final name; read-only for everyone but root.
    """
    hexdigest = check_digest(digest)
    target = into / hexdigest
    if target.is_dir():
        return target
    if digest_of(data) != digest:
        raise SpecError(f"workdir {digest}: the stored bytes do not match their digest")
    into.mkdir(parents=True, exist_ok=True)
    tmp = into / f".{hexdigest}.{os.getpid()}.tmp"
    tmp.mkdir()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
    except (tarfile.TarError, OSError) as exc:  # FilterError: an absolute path, '..', a link out
        raise SpecError(f"workdir {digest}: cannot be unpacked safely: {exc}") from None
    for folder, _dirs, names in os.walk(tmp):
        os.chmod(folder, 0o755)
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)
    try:
        tmp.rename(target)
    except OSError:  # another attempt unpacked it meanwhile
        if not target.is_dir():
            raise
    return target
