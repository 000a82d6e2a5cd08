"""The storage checks: ``checkpoint_root`` takes this node's marker and its jobs' directories, and
is the same storage as on the nodes that ran ``fleet doctor`` before."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

import redis

from fleet.config_sections import DAY, AgentSettings
from fleet.keys import Keys
from fleet.ops.doctor.report import FAIL, OK, Check

#: markers older than this are forgotten (a node since removed, a storage since remounted)
MARKER_TTL_S = 7 * DAY
MARKER_DIR = ".fleet-doctor"
_MARKER_MAX = 4096
#: a node name, as the agent's settings allow it: a marker's name becomes a file name
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


def new_marker(node: str, root: Path, now: float) -> str:
    """What a node writes to its marker file and to Redis: its name, the time, a random nonce."""
    return json.dumps({"node": node, "at": now, "nonce": secrets.token_hex(16), "root": str(root)})


def job_identity(cfg: AgentSettings) -> tuple[tuple[int, int], str]:
    """Whom the checks stand for, and the setting that names it: the node's fixed ``job_user``, or
    the first uid of ``job_uid_range`` (every tenant's jobs run as one of its uids, gid the same)."""
    if cfg.fixed_user is not None:
        return cfg.fixed_user, "agent.job_user"
    start = cfg.uid_range[0]
    return (start, start), "agent.job_uid_range"


def checkpoint_check(
    root: Path,
    node: str,
    marker: str,
    job_user: tuple[int, int],
    setting: str = "agent.job_user",
    euid: int | None = None,
    mounts: Path = Path("/proc/self/mounts"),
) -> Check:
    """``checkpoint_root`` is there, takes this node's marker, lets root give a job's directory to
    the job's user (as the agent does: NFS' root_squash forbids it), and the job's user (``job_user``,
    from ``setting``) can reach it."""
    euid = os.geteuid() if euid is None else euid
    name = "checkpoint root"
    if not root.is_dir():
        return Check(
            name,
            FAIL,
            f"checkpoint_root {root} does not exist (or is not a directory)",
            f"mount the shared storage (e.g. NFS) at {root} on every node, or set checkpoint_root",
        )
    where = f"{root} on {mount_of(root, mounts)}"
    folder = root / MARKER_DIR
    try:
        folder.mkdir(mode=0o755, exist_ok=True)
        _write_marker(folder, node, marker)
    except OSError as exc:
        return Check(
            name,
            FAIL,
            f"{where}: cannot write {folder / node}: {exc.strerror}",
            "make checkpoint_root writable by root (a read-only mount? on NFS: no_root_squash)",
        )
    job_uid, job_gid = job_user
    done = [f"{where}: writable"]
    if euid == 0:
        probe = folder / f"{node}.chown-{secrets.token_hex(4)}"
        try:
            probe.mkdir(mode=0o700)
            os.chown(probe, job_uid, job_gid)
        except OSError as exc:
            return Check(
                name,
                FAIL,
                f"{where}: root cannot give a job's directory to its user "
                f"({job_uid}:{job_gid}): {exc.strerror}",
                "export the storage to the GPU nodes with no_root_squash: the agent (root) "
                "makes each job a directory owned by the job's user",
            )
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
        done.append(f"jobs' directories can be given to {job_uid}:{job_gid}")
    else:
        done.append("not root, so jobs run as this user (the agent runs as root)")
        job_uid, job_gid = euid, os.getegid()
    if blocked := unreachable(root, job_uid, job_gid):
        path, mode = blocked
        return Check(
            name,
            FAIL,
            f"{where}: uid {job_uid} ({setting}) cannot enter {path} "
            f"(mode {mode:04o}): its jobs cannot reach their checkpoints",
            f"chmod o+x {path}",
        )
    return Check(name, OK, ", ".join(done))


def _write_marker(folder: Path, node: str, marker: str) -> None:
    temporary = folder / f"{node}.tmp-{secrets.token_hex(4)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(marker)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, folder / node)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def unreachable(root: Path, uid: int, gid: int) -> tuple[Path, int] | None:
    """The first directory from ``/`` down to ``root`` that ``uid``:``gid`` may not enter, with its
    mode; None when it reaches ``root`` (root may enter anything)."""
    if uid == 0:
        return None
    path = root.resolve()
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if st.st_uid == uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return directory, stat.S_IMODE(st.st_mode)
    return None


def mount_of(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str:
    """``fstype source`` of the mount holding ``path`` (``nfs4 server:/export``), or ``?``."""
    target, best = str(path.resolve()), ("", "?")
    with contextlib.suppress(OSError):
        for line in mounts.read_text().splitlines():
            source, point, fstype, *_ = [*line.split(" "), "", ""]
            point = point.replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, f"{fstype} {source}")
    return best[1]


def shared_check(client: redis.Redis, keys: Keys, root: Path, node: str, marker: str, now: float) -> Check:
    """Publish this node's marker, then look for each other node's in this ``checkpoint_root``: every
    node that left one must have left it here, with the same content. Each node reaches a job's
    directory through its own ``checkpoint_root``, so the paths may differ; the storage may not."""
    name = "shared storage"
    try:
        markers = publish_marker(client, keys, node, marker, now)
    except redis.exceptions.NoPermissionError as exc:
        return Check(
            name,
            FAIL,
            f"cannot write {keys.doctor('markers')}: {exc}",
            f"the user's users.acl line must grant ~{keys.prefix}:* (key_prefix)",
        )
    except redis.RedisError as exc:
        return Check(name, FAIL, f"cannot publish this node's marker in Redis: {exc}", "see the redis line")
    same, problems = [], []
    for other, text in sorted(markers.items()):
        theirs = f"its checkpoint_root: {_field(text, 'root')}"
        if (here := _read_capped(root / MARKER_DIR / other)) is None:
            problems.append(f"node {other}'s marker is not here ({theirs})")
        elif here != text:
            problems.append(f"node {other}'s marker here is not the one it last wrote ({theirs})")
        else:
            same.append(other)
    also = f" (same storage as {_nodes(same)})" if same else ""
    if problems:
        return Check(
            name,
            FAIL,
            f"{'; '.join(problems)}: checkpoint_root is not shared storage{also}",
            "mount the same shared storage (e.g. NFS) on every node as its checkpoint_root, then run "
            "fleet doctor again on each (over NFS a marker written in the last minute may not show yet)",
        )
    if not same:
        return Check(
            name,
            OK,
            "no other node has left a marker yet: run fleet doctor on each node; "
            "each checks the nodes that ran it before",
        )
    return Check(name, OK, f"same storage as {_nodes(same)}")


def publish_marker(client: redis.Redis, keys: Keys, node: str, marker: str, now: float) -> dict[str, str]:
    """Store this node's marker; the other nodes' markers, by node, those younger than the TTL (older
    ones are deleted) whose names are node names (a marker's name becomes a file name)."""
    key = keys.doctor("markers")
    pipe = client.pipeline(transaction=True)
    pipe.hset(key, node, marker)
    pipe.expire(key, int(MARKER_TTL_S))
    pipe.hgetall(key)
    markers: dict[str, str] = pipe.execute()[-1]
    stale = [n for n, text in markers.items() if n != node and _age(text, now) > MARKER_TTL_S]
    if stale:
        client.hdel(key, *stale)
    return {n: t for n, t in markers.items() if n != node and n not in stale and _NODE_NAME.fullmatch(n)}


def _nodes(names: list[str]) -> str:
    return ("node " if len(names) == 1 else "nodes ") + ", ".join(names)


def _field(text: str, field: str) -> Any:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return json.loads(text).get(field)
    return None


def _age(text: str, now: float) -> float:
    at = _field(text, "at")
    return now - at if isinstance(at, int | float) else float("inf")


def _read_capped(path: Path) -> str | None:
    """A marker file's text (never through a symlink, at most a few KiB), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(_MARKER_MAX).decode(errors="replace")
