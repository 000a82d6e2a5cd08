"""Remove the checkpoint directories of jobs that retention deleted.

Every agent sweeps ``checkpoint_root`` every ``checkpoint_sweep_interval_s``. A directory goes only
when its name is a valid job id, it is a directory itself (never a symlink, never followed), its
job has no record and the job's tombstone says retention deleted it. So the directory of a job that
exists is never touched, nor one fleet knows nothing about (another fleet's on the same storage, an
operator's, one whose tombstone was forgotten before any agent swept). While the tombstone lasts no
new job can take the id (``submit.lua``), so nothing can start writing there meanwhile. Agents on
shared storage sweep the same root; whichever comes first removes a directory. A job's kept outputs
(``.fleet-outputs/<tenant>/<job id>``, :mod:`fleet.outputs`) go by the same rule, in the same sweep.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

from fleet.agent import checkpoints
from fleet.errors import SpecError
from fleet.log import event
from fleet.models import check_job_id
from fleet.outputs import OUTPUTS
from fleet.state.retention import RetentionStore


def job_dirs(root: Path) -> list[str]:
    """Names of the directories (not symlinks, not files) in ``root`` that are valid job ids."""
    try:
        entries = os.scandir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with entries:
        return sorted(e.name for e in entries if _job_id(e.name) and e.is_dir(follow_symlinks=False))


def _job_id(name: str) -> bool:
    try:
        check_job_id(name)
    except SpecError:
        return False
    return True


def remove(root: Path, job_id: str) -> bool:
    """Remove ``root/job_id`` if it is a directory, without following any symlink in or at it;
    False when it is not there (another agent was first) or is not a directory."""
    path = checkpoints.job_dir(root, job_id)  # validates the id again: it becomes a path
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        # rmtree works on directory fds here (rmtree.avoids_symlink_attacks): links are unlinked,
        # never followed, and a directory swapped for a link midway is refused
        shutil.rmtree(path)
    except FileNotFoundError:
        return False
    return True


def sweep(root: Path, retention: RetentionStore, log: logging.Logger) -> list[str]:
    """Remove the directories of expired jobs under ``root``, and their kept outputs; the ids whose
    checkpoint directory was removed, each removal logged."""
    removed = []
    for job_id in sorted(retention.expired(job_dirs(root))):
        try:
            if remove(root, job_id):
                removed.append(job_id)
                event(log, "checkpoint_dir_removed", job=job_id, why="the job expired (job_retention_s)")
        except OSError as exc:
            event(log, "checkpoint_dir_not_removed", logging.WARNING, job=job_id, error=exc)
    kept = root / OUTPUTS
    for tenant in _tenants(kept):
        for job_id in sorted(retention.expired(job_dirs(kept / tenant))):
            try:
                if remove(kept / tenant, job_id):
                    event(log, "outputs_removed", job=job_id, why="the job expired (job_retention_s)")
            except OSError as exc:
                event(log, "outputs_not_removed", logging.WARNING, job=job_id, error=exc)
    return removed


def _tenants(folder: Path) -> list[str]:
    try:
        entries = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with entries:
        return sorted(
            e.name for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
        )
