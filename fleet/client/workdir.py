"""The client's half of shipping a directory with a job (:mod:`fleet.workdir` has the whole story):
pack it into a deterministic tar.gz (sorted, no times or owners, so an unchanged directory packs to
the same bytes and is not uploaded again), without ``.git/`` and what ``.gitignore`` or
``.fleetignore`` name; a link leading out of the directory is refused here, at submit."""

from __future__ import annotations

import fnmatch
import gzip
import io
import os
import posixpath
import tarfile
from pathlib import Path

from fleet.errors import SpecError
from fleet.workdir import IGNORE_FILES, MAX_BYTES, outside, within


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
        links = [d for d in dirs if (here / d).is_symlink()]  # a link to a directory: never entered
        dirs[:] = sorted(d for d in dirs if not (d in links or _ignored(_join(rel_dir, d), True, patterns)))
        for name in sorted([*names, *links]):
            rel = _join(rel_dir, name)
            path = here / name
            if path.is_symlink():
                if _ignored(rel, True, patterns) or _ignored(rel, False, patterns):
                    continue
                _check_link(base, rel, path, root)
            elif _ignored(rel, False, patterns) or not path.is_file():
                continue
            files.append((rel, path))
            total += path.lstat().st_size
            if total > max_bytes:
                raise SpecError(
                    f"workdir {str(root)!r}: more than {max_bytes >> 20} MiB to ship (at {rel}); leave data, "
                    "checkpoints and environments out with a .fleetignore (or .gitignore), or mount them"
                )
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
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
