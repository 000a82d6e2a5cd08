"""An attempt's working directory on the host, the same for both runtimes that run one.

Each attempt lives in ``<root>/<job>.<attempt>/`` (root's, 0711) with a ``work`` directory the job
owns (0700): a private, writable copy of the job's shipped directory, or empty when it ships none.
The process runtime starts the job in it; the Docker runtime bind-mounts it into the container
(:mod:`fleet.agent.runtime.docker`). When the attempt ends the agent keeps the spec's ``outputs``
from it (:mod:`fleet.agent.outputs`), then the runtime removes the whole attempt directory. A Docker
attempt that reads forwarded input also has ``stdin`` there, a named pipe the job's user alone may
read (0600), mounted into its container. An elastic job's attempt has ``control`` there too (root's,
readable by the job's group, 0750), which holds ``batch_size``, the global batch it is to run at
(0644), made at its start and replaced whenever fleet changes its batch while it runs: the job reads
it through ``FLEET_CONTROL_DIR`` (``fleet_worker.batch_size(follow=True)``), the Docker runtime
mounts it read-only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path

from fleet.agent.checkpoints import traversable
from fleet.agent.runtime.base import LaunchSpec
from fleet.workdir import parent_folder


def make_work(
    folder: Path,
    workdir: Path | None,
    user: tuple[int, int] | None,
    *inner: str,
    files: Mapping[str, bytes] | None = None,
) -> Path:
    """``folder/work``: a copy of ``workdir`` (links copied as links) when it is not there yet, with
    each of the ``inner`` relative directories made in it, and ``files`` (relative path: bytes; a
    function's call) written into it, all given to ``user`` (where this runs as root; None: this
    process's own user), ``work`` itself 0700."""
    traversable(folder)
    work = folder / "work"
    fresh = not work.exists()
    if workdir is not None and fresh:
        shutil.copytree(workdir, work, symlinks=True)
    work.mkdir(parents=True, exist_ok=True)
    for relative in inner:
        (work / relative).mkdir(mode=0o700, parents=True, exist_ok=True)
    for relative, data in (files or {}).items() if fresh else ():
        _write_new(parent_folder(work, relative, mode=0o700) / relative.rsplit("/", 1)[-1], data)
    uid, gid = user if user else (None, None)
    if uid is not None and os.geteuid() == 0:
        for path in [work, *work.rglob("*")]:
            os.chown(path, uid, gid if gid is not None else -1, follow_symlinks=False)
    work.chmod(0o700)
    return work


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file at ``path``: whatever the shipped tree had there (a link) is
    replaced, never written through."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def make_stdin_pipe(folder: Path, user: tuple[int, int] | None) -> Path:
    """``folder/stdin``, a named pipe (made when it is not there yet) the job's ``user`` alone reads
    (0600, given to it where this runs as root; root, the agent, writes into it)."""
    traversable(folder)
    pipe = folder / "stdin"
    with contextlib.suppress(FileExistsError):
        os.mkfifo(pipe, 0o600)
    if user is not None and os.geteuid() == 0:
        os.chown(pipe, user[0], user[1], follow_symlinks=False)
    os.chmod(pipe, 0o600)  # past the umask
    return pipe


#: an attempt's folder for what fleet tells it while it runs, and the file in it with its batch
CONTROL, BATCH_FILE = "control", "batch_size"


def make_control(folder: Path, spec: LaunchSpec) -> Path | None:
    """For an elastic attempt (``spec.control``, with a batch), ``folder/control`` holding
    ``batch_size`` (both made when not there yet): root's where this runs as root, the job's group
    may read it (0750), nobody but root writes; None for any other attempt."""
    if not (spec.control and spec.batch_size):
        return None
    user, batch = spec.user, spec.batch_size
    traversable(folder)
    control = folder / CONTROL
    control.mkdir(mode=0o750, exist_ok=True)
    if user is not None and os.geteuid() == 0:
        os.chown(control, 0, user[1], follow_symlinks=False)
    control.chmod(0o750)
    if not (control / BATCH_FILE).exists():
        write_batch(folder, batch)
    return control


def write_batch(folder: Path, batch: int) -> bool:
    """Replace the attempt's ``control/batch_size`` with ``batch`` at once (a reader sees the old
    value or the new one, never part of one); False when the attempt has no control folder."""
    control = folder / CONTROL
    if not control.is_dir():
        return False
    temp = control / f".{BATCH_FILE}.{os.getpid()}.{threading.get_ident()}"
    _write_new(temp, f"{batch}\n".encode())
    os.chmod(temp, 0o644)  # the job's group reads it
    os.replace(temp, control / BATCH_FILE)
    return True


def read_batch(folder: Path) -> int | None:
    """The batch the attempt's ``control/batch_size`` holds; None without one (or unreadable)."""
    try:
        return int((folder / CONTROL / BATCH_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


class AttemptFolders:
    """What a runtime whose attempts each live in ``<root>/<job>.<attempt>/`` finds there: the stdin
    pipe, the working directory, the control folder (``base.Piped``, ``base.Batched``)."""

    root: Path

    def _dir(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{job_id}.{attempt}"

    def stdin_pipe(self, job_id: str, attempt: int) -> Path:
        """The named pipe an attempt started with ``stdin`` reads as its stdin (the supervisor's)."""
        return self._dir(job_id, attempt) / "stdin"

    def work_dir(self, job_id: str, attempt: int) -> Path | None:
        work = self._dir(job_id, attempt) / "work"
        return work if work.is_dir() else None

    def set_batch(self, job_id: str, attempt: int, batch: int) -> bool:
        return write_batch(self._dir(job_id, attempt), batch)

    def batch_of(self, job_id: str, attempt: int) -> int | None:
        return read_batch(self._dir(job_id, attempt))
