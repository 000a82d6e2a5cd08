"""The client's cache on the user's machine: ``$XDG_CACHE_HOME/fleet`` (``~/.cache/fleet``), private
to the user (folders 0700, files 0600), one small JSON file per entry.

Only what can be worked out again lives here (a shipped directory's digest against its listing):
an entry that is missing, unreadable, or in a folder another user could write is a miss, never an
error; a cache that cannot be written is skipped. So a submit works the same with no home
directory, a read-only one, or a cache removed under it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

_NAME = re.compile(r"^[0-9a-z]+\Z")
_VALUE = re.compile(r"^sha256:[0-9a-f]{64}\Z")


def folder() -> Path:
    """``$XDG_CACHE_HOME/fleet``, else ``~/.cache/fleet`` (the XDG base directory rule)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the spec says to ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleet"


def get(kind: str, name: str, key: str) -> str | None:
    """The value stored for ``key`` under ``kind/name``; None when there is none (or it is not ours)."""
    path = _private(kind, create=False)
    if path is None:
        return None
    try:
        fd = os.open(path / f"{name}.json", os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as entry:
            if os.fstat(entry.fileno()).st_uid != os.getuid():
                return None
            stored = json.load(entry)
    except (OSError, ValueError):
        return None
    value = stored.get("value") if isinstance(stored, dict) and stored.get("key") == key else None
    return value if isinstance(value, str) and _VALUE.match(value) else None


def put(kind: str, name: str, key: str, value: str) -> None:
    """Store ``value`` for ``key`` under ``kind/name`` (replacing what was there), atomically; nothing
    when the cache cannot be written."""
    if not (_NAME.match(kind) and _NAME.match(name)):
        raise ValueError(f"cache entry {kind}/{name}: expected lowercase letters and digits")
    path = _private(kind, create=True)
    if path is None:
        return
    temp = path / f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as entry:
            json.dump({"key": key, "value": value}, entry)
        os.replace(temp, path / f"{name}.json")
    except OSError:
        temp.unlink(missing_ok=True)


def _private(kind: str, create: bool) -> Path | None:
    """The folder of ``kind``, when it and ``fleet/`` are the user's own folders and private (with
    ``create``: made 0700 where missing, made private where they are not); None otherwise."""
    top = folder()
    path = top / kind
    try:
        if create:
            os.makedirs(path, mode=0o700, exist_ok=True)
        for each in (top, path):
            st = os.lstat(each)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                return None
            if st.st_mode & 0o077:
                if not create:
                    return None
                os.chmod(each, 0o700)
    except OSError:
        return None
    return path
