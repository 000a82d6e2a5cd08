"""The leader's view of elastic jobs: which exist, their ranges and sizes, and the step's inputs.

Learnt as tenancy learns what runs: from the jobs the controller reads anyway (those messages name,
those newly queued), mended by every full reconcile. The decisions are the pass's
(``fleet.scheduler.passes``, ``resizing``); the controller carries them out (``apply.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fleet.config_sections import ControllerSettings
from fleet.errors import SpecError
from fleet.log import event
from fleet.models import Job, JobState, uploaded_profile
from fleet.scheduler import PendingQueue
from fleet.scheduler.profiles import Profile
from fleet.scheduler.resizing import Elastic, Resize
from fleet.state.profiles import ProfileStore, learned

log = logging.getLogger("fleet.controller")


class Elasticity:
    def __init__(self, cfg: ControllerSettings, profiles: ProfileStore) -> None:
        self.cfg, self.profiles = cfg, profiles
        #: uploaded profiles found missing or unreadable (logged once each)
        self._lost: set[str] = set()
        #: every elastic job queued or on a node, as last read (or as the step left it)
        self.jobs: dict[str, Job] = {}

    def observe(self, jobs: Iterable[Job]) -> bool:
        """Jobs just read; True when an elastic one came, went or changed."""
        changed = False
        for job in jobs:
            if not job.spec.elastic:
                continue
            if job.state.final:
                changed |= self.jobs.pop(job.id, None) is not None
            elif self.jobs.get(job.id) != job:
                self.jobs[job.id], changed = job, True
        return changed

    def resync(self, on_nodes: Iterable[Job], queued: Iterable[str]) -> None:
        """Every job on a node, as just read, and the ids queued: the truth replaces what was learnt."""
        waiting = set(queued)
        self.jobs = {i: j for i, j in self.jobs.items() if i in waiting and j.state == JobState.QUEUED}
        self.observe(on_nodes)
        self.profiles.keep(p for j in self.jobs.values() if uploaded_profile(p := j.spec.profile or ""))

    def step_jobs(self, queue: PendingQueue, now: float) -> list[Elastic]:
        """The elastic step's jobs (``PassInput.elastic``): running first, then queued by rank."""
        for job_id in [i for i, j in self.jobs.items() if j.state == JobState.QUEUED and i not in queue]:
            del self.jobs[job_id]  # cancelled, or placed and not read since: the next read says
        return sorted(
            (Elastic.of(j, self._profile(j), now) for j in self.jobs.values()),
            key=lambda e: (not e.running, _rank(self.jobs[e.id])),
        )

    def placed(self, job_id: str, attempt: int) -> None:
        """A queued elastic job was just placed: it holds its GPUs now (until read again)."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.jobs[job_id] = job.model_copy(update={"state": JobState.SCHEDULED, "attempt": attempt})

    def resized(self, job: Job, change: Resize, now: float) -> Job:
        """``job`` as the store now holds it after ``change`` was written (until it is read again)."""
        if change.in_place:
            updated = job.model_copy(update={"batch_size": change.new.batch})
        elif change.running:
            updated = job.model_copy(
                update={"resize_gpus": change.new.gpus, "resize_batch": change.new.batch, "preempt": "resize"}
            )
        else:
            updated = job.model_copy(
                update={"num_gpus": change.new.gpus, "batch_size": change.new.batch, "sized_at": now}
            )
        self.jobs[job.id] = updated
        return updated

    def _profile(self, job: Job) -> Profile:
        """The job's profile; one uploaded that is gone (no leader kept it for ``workdir_retention_s``)
        or unreadable: learned from its reports instead, so that it still runs."""
        try:
            return self.profiles.profile_of(job.spec, job.measured)
        except SpecError as exc:
            if job.spec.profile not in self._lost:
                self._lost.add(job.spec.profile or "")
                event(
                    log,
                    "profile_lost",
                    logging.WARNING,
                    job=job.id,
                    error=exc,
                    effect="learned from its reports",
                )
            return learned(job.spec, job.measured)


def _rank(job: Job) -> tuple[int, int]:
    return (-job.spec.priority, job.seq)
