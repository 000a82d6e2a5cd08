"""``/v1/jobs/{id}/outputs`` and ``/v1/jobs/{id}/checkpoint``: a job's kept outputs and its
checkpoints, as a gzipped tar (``fleet download``), read from the checkpoint storage
(``checkpoint_root``, which this host must mount as the nodes do: :mod:`fleet.outputs`).

The API reads them as a member of the storage group (``storage_group``; ``fleet install api`` runs
it with that group), to which the agents give them, or as root. Only the job's tenant reads them
(operators and admins any): to a user of another tenant the job answers as a missing one does. A
path sent is checked before it names anything, and what is read is read as the job left it: nothing
through a link, only directories and regular files.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from fleet.agent.checkpoints import job_dir, read_marker
from fleet.api.commands import Commands
from fleet.api.deps import User, own_job
from fleet.config import Settings
from fleet.errors import ConfigError, NotFound, SpecError
from fleet.models import Identity, Job, relative_path
from fleet.outputs import FILES, kept_dir, open_dir, open_file, open_under, read_kept, tar_file, tar_tree

TAR = "application/gzip"
#: a checkpoint is one file name in the job's directory (the SDK's names)
_CHECKPOINT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")


def routes(backend: Commands, settings: Settings) -> APIRouter:
    router = APIRouter()
    root = settings.checkpoint_root

    def job_of(who: Identity, job_id: str) -> Job:
        job = backend.get(job_id)
        own_job(who, job.spec.tenant, job_id)
        return job

    @router.get("/v1/jobs/{job_id}/outputs", response_model=None)
    def outputs(job_id: str, who: User, path: str = "") -> StreamingResponse:
        """The job's kept outputs (the latest attempt's), or the part of them under ``path``."""
        job = job_of(who, job_id)
        return _tar(_outputs(_reachable(root), job, path), job.id)

    @router.get("/v1/jobs/{job_id}/checkpoint", response_model=None)
    def checkpoint(job_id: str, who: User, name: str = "latest") -> StreamingResponse:
        """One checkpoint of the job (``latest``: the one its ``latest`` marker names)."""
        job = job_of(who, job_id)
        return _tar(_checkpoint(_reachable(root), job, name), job.id)

    return router


def _outputs(root: Path, job: Job, path: str) -> Iterator[bytes]:
    try:
        inner = relative_path(path, "path: give a path inside the job's outputs, without '..'")
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    folder = kept_dir(root, job.spec.tenant, job.id)
    why = f": {job.outputs_note}" if job.outputs_note else ""
    none = NotFound(
        f"job {job.id} has no kept outputs{why} (it keeps what its attempts leave in "
        f"{job.spec.outputs}/ of their working directory)"
    )
    try:
        os.close(_open(folder))  # a folder the API may not read says so, not that there is none
    except FileNotFoundError:
        raise none from None
    if read_kept(folder) is None:
        raise none
    try:
        top = _open(folder / FILES)
    except FileNotFoundError:
        raise none from None
    try:
        fd = open_under(top, inner)
    except OSError:
        raise NotFound(f"job {job.id}'s kept outputs hold no directory {inner!r}") from None
    finally:
        os.close(top)
    return tar_tree(fd, "")


def _checkpoint(root: Path, job: Job, name: str) -> Iterator[bytes]:
    if name != "latest" and not _CHECKPOINT.match(name):
        raise SpecError(
            f"checkpoint {name!r}: give 'latest' or a checkpoint's file name (letters, digits, '_', "
            "'.', '-'; no '/' or '..')"
        )
    folder = job_dir(root, job.id)
    try:
        top = _open(folder)  # first: a folder the API may not read says so, not that there is none
    except FileNotFoundError:
        raise NotFound(f"job {job.id} has no checkpoints") from None
    try:
        if name == "latest":
            marker = read_marker(folder)
            if marker is None:
                raise NotFound(f"job {job.id} has no checkpoint (its `latest` marker names none)")
            name = marker.name
        owner = os.fstat(top).st_uid  # a file only of the job's own: never a hard link to another's
        fd = open_file(top, name, owner)
        if fd is None:
            raise NotFound(f"job {job.id} has no checkpoint {name!r}{_private(top, name)}")
    finally:
        os.close(top)
    return tar_file(fd, name)


def _private(top: int, name: str) -> str:
    """Why a regular file the API could not open is not served: it is the job's alone."""
    try:
        info = os.stat(name, dir_fd=top, follow_symlinks=False)
    except OSError:
        return ""
    if not stat.S_ISREG(info.st_mode) or os.access(name, os.R_OK, dir_fd=top):
        return ""
    mode = stat.S_IMODE(info.st_mode)
    return (
        f" the API may read: the job wrote it readable by itself alone (mode {mode:04o}); write "
        "checkpoints readable by their group (the fleet_worker SDK does, under the usual umask 022)"
    )


def _reachable(root: Path) -> Path:
    """``root`` if this host can read it; :class:`ConfigError` saying to mount it otherwise."""
    try:
        there = stat.S_ISDIR(root.stat().st_mode)
    except PermissionError:  # a folder above it is closed to the API's user
        there = None
    except OSError:
        there = False
    if there is False:
        raise ConfigError(
            f"checkpoint_root {root} is not on the API's host: mount the checkpoint storage (as the "
            "nodes do) at checkpoint_root where the API runs"
        )
    # passed through to known names only (0711, as the agents make it)
    if there is None or not os.access(root, os.X_OK):
        raise ConfigError(
            f"checkpoint_root {root}: the API's user cannot read it; run the API in the storage group "
            "(storage_group; `fleet install api` does) or as root"
        )
    return root


def _open(folder: Path) -> int:
    """``folder``'s fd; :class:`NotFound`-like ``FileNotFoundError`` when it is not there (or a link)."""
    try:
        return open_dir(folder)
    except (NotADirectoryError, OSError) as exc:
        if not isinstance(exc, PermissionError):
            raise FileNotFoundError(str(folder)) from None
        raise ConfigError(
            f"{folder}: the API's user cannot read it; run the API in the storage group (storage_group; "
            "`fleet install api` does) or as root, and give the nodes that group (`fleet install "
            "agent` does): what they kept before they had it stays root's alone"
        ) from None


def _tar(chunks: Iterator[bytes], job_id: str) -> StreamingResponse:
    disposition = f'attachment; filename="{job_id}.tar.gz"'
    return StreamingResponse(chunks, media_type=TAR, headers={"Content-Disposition": disposition})
