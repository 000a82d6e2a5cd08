"""What the API changes, on Redis: submit (one job, a batch, an array), cancel, resize, cordon and
drain. Every spec is admitted first (``fleet.api.admission``); the controller hears of each change
through the bus (a hint: its periodic pass finds every change anyway)."""

from __future__ import annotations

import functools
import getpass
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.api import admission
from fleet.api.placeable import Shapes
from fleet.api.queries import Queries, known_id
from fleet.bus import rebatch_attempt, stop_attempt
from fleet.bus.hints import Hints
from fleet.bus.messages import CONTROLLER_QUEUE, MAX_NAMED, NodeChanged, QueueLeft
from fleet.config import Settings
from fleet.errors import FleetError, IdInUse, SpecError, StoreUnavailable, at_index
from fleet.log import event
from fleet.models import (
    CancelReport,
    Job,
    JobArray,
    JobSpec,
    JobState,
    Node,
    NodeState,
    Webhook,
    check_job_id,
)
from fleet.models.arrays import check_indices, parse_indices, task_id
from fleet.progress import follows_batch
from fleet.scheduler.sizing import Size, change
from fleet.state import Stores

if TYPE_CHECKING:
    from fleet.bus.broker import Bus

log = logging.getLogger("fleet.api.backend")
#: a submit retries a Redis outage this many times, after 0.25, 0.5, 1, 2 s (each try may also wait
#: out the 5 s socket timeout), always with the same job id
SUBMIT_RETRIES = 4
SUBMIT_BACKOFF_S = 0.25
#: generated ids tried before a submit gives up (each is taken with odds of about jobs / 2^48)
NEW_ID_TRIES = 5
T = TypeVar("T")


def new_id(name: str) -> str:
    """A fresh job (or array) id: the name, and 48 random bits (collisions are caught and retried)."""
    return f"{name[:40]}-{secrets.token_hex(6)}"


class Commands(Queries):
    """The fleet's writes, with its reads (a cancel reads the job it stops)."""

    def __init__(self, settings: Settings, stores: Stores, *, background_hints: bool = False) -> None:
        """``background_hints``: the controller is told of new jobs by a thread of this object's, not
        by the submit (the API: a submit answers once its job is stored)."""
        super().__init__(stores)
        self.settings = settings
        self._tenants, self._profiles = stores.tenants, stores.profiles
        self._bus: Bus | None = None
        self._shapes = Shapes(self._nodes.all)
        self._hints = Hints(lambda: self.bus, background=background_hints)

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            from fleet.bus.broker import Bus  # dramatiq: only commands that send a message import it

            self._bus = Bus(self.settings)
        return self._bus

    def check_webhook(self, hook: Webhook | None) -> None:
        """:class:`SpecError` for a webhook whose host is written as an address fleet never sends to."""
        admission.check_webhook(hook, self.settings)

    def admit(self, spec: JobSpec | dict[str, Any], named: admission.Named | None = None) -> JobSpec:
        """The spec, if this fleet runs it (:func:`fleet.api.admission.admit`) and a registered node
        could ever hold it (:class:`fleet.api.placeable.Shapes`)."""
        spec = admission.admit(spec, self.settings, self._tenants, self._profiles, self._jobs, named)
        self._shapes.check(spec)
        return spec

    # -- jobs --------------------------------------------------------------------------

    def submit(self, spec: JobSpec | dict[str, Any], *, job_id: str | None = None, owner: str = "") -> Job:
        """Queue a job; with ``job_id`` a repeated submit of the same spec is a no-op (idempotent).

        Every try of one submit stores the same ``created_at``, so a retry after a Redis error that
        struck once the job was stored finds it there and succeeds instead of queueing it twice. An
        id fleet generates is never taken for another job's: if one is already in use, the submit
        picks another (a silent "already there" lost one job in a 10,000-job submit loop).
        """
        spec = self.admit(spec)
        job_id = self._create(spec, None if job_id is None else check_job_id(job_id), owner)
        self._notify_submitted(job_id)
        return self._jobs.get(job_id)

    def _create(self, spec: JobSpec, chosen: str | None, owner: str) -> str:
        """Store the job under ``chosen`` or, if None, a new id; the id it was stored under."""
        now = time.time()
        for _ in range(NEW_ID_TRIES):
            job_id = chosen or new_id(spec.name)
            create = functools.partial(self._create_once, job_id, spec, now, chosen is None, owner)
            if self._retry_store(create):
                return job_id
        raise FleetError(f"no free job id after {NEW_ID_TRIES} tries; pass job_id")

    def _retry_store(self, write: Callable[[], T]) -> T:
        """Run an idempotent ``write``, retrying a Redis outage with backoff; what it returned."""
        for retry in range(SUBMIT_RETRIES):
            try:
                return write()
            except StoreUnavailable:
                time.sleep(SUBMIT_BACKOFF_S * 2**retry)
        return write()

    def _create_once(self, job_id: str, spec: JobSpec, now: float, generated: bool, owner: str) -> bool:
        """True once the job is stored, by this try or an earlier one of the same submit; False when
        a ``generated`` id turns out to be another job's (or an expired one's, or an array's)."""
        try:
            if self._jobs.create(job_id, spec, now, owner):
                return True
        except IdInUse:
            if generated:
                return False
            raise
        stored = self._jobs.get(job_id)
        if stored.created_at == now and stored.spec == spec:
            return True  # this submit's own earlier try stored it, and its answer was lost
        if generated:
            return False
        if stored.spec != spec:
            raise SpecError(f"job id {job_id!r} already exists with a different spec; choose another id")
        return True

    def _notify_submitted(self, job_id: str) -> None:
        """Wake the controller (:mod:`fleet.bus.hints`: a hint, never failing the submit)."""
        self._hints.name([job_id])

    def submit_many(
        self,
        specs: Sequence[JobSpec | dict[str, Any]],
        *,
        job_ids: Sequence[str | None] | None = None,
        owner: str = "",
    ) -> list[str]:
        """Queue many jobs in one round trip to Redis; their ids, in order. All or nothing: every spec
        (and id given) is checked before any job is stored, the jobs their ``after`` names read once, and
        the first refusal names its index (``jobs[3]: gpus: ...``). ``job_ids[i]``: as submit's job_id."""
        chosen: list[str | None] = list(job_ids) if job_ids is not None else [None] * len(specs)
        if len(chosen) != len(specs):
            raise SpecError(f"job_ids: {len(chosen)} ids for {len(specs)} specs; give one per spec (or None)")
        named = admission.Named(self._jobs)
        admitted = [at_index(i, self.admit, spec, named) for i, spec in enumerate(specs)]
        seen: dict[str, int] = {}
        for i, job_id in enumerate(chosen):
            if job_id is None:
                continue
            at_index(i, check_job_id, job_id)
            if job_id in seen:
                raise SpecError(f"jobs[{i}]: id {job_id!r} is also jobs[{seen[job_id]}]'s; give each its own")
            seen[job_id] = i
        ids = [job_id or new_id(spec.name) for job_id, spec in zip(chosen, admitted, strict=True)]
        self._refuse_taken(ids, chosen, admitted)
        now, pending = time.time(), list(range(len(ids)))
        for _ in range(NEW_ID_TRIES):
            batch = [(ids[i], admitted[i]) for i in pending]
            codes = self._retry_store(functools.partial(self._jobs.create_many, batch, now, owner))
            held = [i for i, code in zip(pending, codes, strict=True) if code != 1]
            stored = {job.id: job for job in self._jobs.get_many(ids[i] for i in held)}
            pending = []
            for i in held:
                job = stored.get(ids[i])
                if job is not None and job.spec == admitted[i] and (chosen[i] or job.created_at == now):
                    continue  # stored by an earlier try of this batch, or by an earlier same batch
                if chosen[i] is not None:  # taken since _refuse_taken looked
                    raise IdInUse(
                        f"jobs[{i}]: job id {ids[i]!r} was taken meanwhile; choose another id (the jobs "
                        "before it are queued: a repeated batch with the same ids queues each once)"
                    )
                ids[i] = new_id(admitted[i].name)
                pending.append(i)
            if not pending:
                break
        else:
            raise FleetError(f"no free job id after {NEW_ID_TRIES} tries; pass job ids")
        self._hints.name(ids)
        return ids

    def _refuse_taken(self, ids: list[str], chosen: list[str | None], specs: list[JobSpec]) -> None:
        """:class:`SpecError` (or :class:`IdInUse`) naming the first chosen id held by another job with
        another spec, a job array, or an expired job's tombstone: before any job is stored."""
        mine = [i for i, job_id in enumerate(chosen) if job_id is not None]
        if not mine:
            return
        held = self._jobs.holders([ids[i] for i in mine])
        existing = {j.id: j for j in self._jobs.get_many(ids[i] for i in mine if held[ids[i]] == "job")}
        for i in mine:
            kind = held[ids[i]]
            if kind == "job" and ids[i] in existing and existing[ids[i]].spec != specs[i]:
                raise SpecError(
                    f"jobs[{i}]: job id {ids[i]!r} already exists with a different spec; choose another id"
                )
            if kind in ("array", "expired"):
                what = "a job array" if kind == "array" else "a job that ended and was deleted"
                raise IdInUse(f"jobs[{i}]: job id {ids[i]!r} is the id of {what}; choose another id")

    def submit_array(
        self,
        spec: JobSpec | dict[str, Any],
        indices: str | Iterable[int],
        *,
        max_running: int | None = None,
        array_id: str | None = None,
        owner: str = "",
    ) -> JobArray:
        """Queue a job array in one call: task ``i`` is the job ``<array id>-<i>``, runs ``spec`` with
        ``FLEET_ARRAY_INDEX=i`` and carries the labels ``fleet.array`` and ``fleet.array.index``.

        ``indices``: ``"0-9999"``, ``"1,3,5-9"`` or integers. ``max_running``: most tasks on nodes at
        once. With ``array_id`` a repeated submit of the same array is a no-op (idempotent).
        """
        spec = self.admit(spec)
        try:
            wanted = parse_indices(indices) if isinstance(indices, str) else check_indices(indices)
        except ValueError as exc:
            raise SpecError(f"array indices {_clip(indices)}: {exc}") from None
        if max_running is not None and (type(max_running) is not int or max_running < 1):
            raise SpecError(f"max_running {max_running!r}: expected a whole number of tasks, at least 1")
        chosen_id = None if array_id is None else check_job_id(array_id)
        now = time.time()
        for _ in range(NEW_ID_TRIES):
            array_id = chosen_id or new_id(spec.name)
            create = functools.partial(
                self._arrays.create, array_id, spec, wanted, max_running, now, not chosen_id, owner
            )
            if self._retry_store(create):
                break
        else:
            raise FleetError(f"no free job array id after {NEW_ID_TRIES} tries; pass array_id")
        self._notify_submitted(task_id(array_id, wanted[0]))
        return self._arrays.get(array_id)

    def cancel(self, job_id: str) -> Job:
        """Cancel: a queued job at once; a running one is stopped by its agent, then CANCELLED."""
        job = self.get(job_id)
        if job.state.final:
            return job
        self._jobs.request_cancel(job_id, time.time())
        job = self._jobs.get(job_id)
        if job.state == JobState.CANCELLED:
            self._notify_left([job_id])
        if job.state.on_node:
            for node in job.nodes_held:  # every member of a multi-node job
                self._stop(job_id, node, job.attempt)
        return job

    def resize(self, job_id: str, gpus: int, batch: int | None = None, who: str = "") -> Job:
        """Give an elastic job ``gpus`` GPUs (within its range) and global batch ``batch`` (default: the
        current one scaled with the GPUs, within its range). A queued job starts at that size; a running
        one checkpoints on SIGTERM (its tenant's ``preempt_grace_s``) and is requeued at it without
        spending a retry, unless only its batch changes and it follows that while it runs (it takes
        it up there). With the controller's elastic step on, the allocator may size it again later."""
        job = self.get(job_id)
        new = admission.resize_target(job, gpus, batch)
        old = Size(job.gpu_count, job.global_batch or 0)
        if new == old:
            return job
        by, now = f" by {who}" if who else "", time.time()
        grace = self._tenants.policy(job.spec.tenant).preempt_grace_s
        reason = f"resized {change(old, new)}{by}"
        if in_place := job.state == JobState.RUNNING and new.gpus == old.gpus and follows_batch(job.progress):
            done = self._jobs.rebatch(job, new.batch, f"batch {old.batch} -> {new.batch} in place{by}", now)
        else:
            done = self._jobs.resize(job, new.gpus, new.batch, reason, grace, now)
        if not done:
            state = self._jobs.get(job_id).state.value
            raise SpecError(f"job {job_id} changed state meanwhile ({state}); try again")
        if in_place:
            rebatch_attempt(self.bus, job.id, job.attempt, job.nodes_held, new.batch)
        elif job.state.on_node:
            stop_attempt(self.bus, job.id, job.attempt, job.nodes_held, reason, grace)
        else:
            self._notify_submitted(job_id)  # the controller reads it again: placed at its new size
        return self._jobs.get(job_id)

    def cancel_array(self, array_id: str) -> CancelReport:
        """Cancel every task of a job array: queued ones at once, in one atomic step per 10,000."""
        return self._cancel_many(self._arrays.task_ids(known_id(array_id)))

    def cancel_labels(self, labels: dict[str, str], tenant: str | None = None) -> CancelReport:
        """Cancel every job not yet final that carries all of ``labels`` (``{"fleet.array": ID}``
        names an array's tasks); with ``tenant``, only that tenant's."""
        if not labels:
            raise SpecError("cancel by label: give at least one label KEY=VALUE")
        return self._cancel_many(self._arrays.matching(labels, tenant))

    def _cancel_many(self, job_ids: list[str]) -> CancelReport:
        report = CancelReport()
        for outcome in self._jobs.cancel_many(job_ids, time.time()):
            if outcome.code == 1:
                report.cancelled.append(outcome.job_id)
            elif outcome.code == 2 and outcome.node:
                report.stopping.append(outcome.job_id)
                self._stop(outcome.job_id, outcome.node, outcome.attempt)
            elif outcome.code == 0:
                report.already_final += 1
        self._notify_left(report.cancelled)
        return report

    def _notify_left(self, job_ids: list[str]) -> None:
        """Tell the controller queued jobs left the queue: its count of the queue would otherwise
        miss jobs added meanwhile as many as those that left (an array's tasks waited for a full
        resync, up to ``resync_interval_s``). A hint, like a submit's."""
        if not job_ids:
            return
        many = len(job_ids) > MAX_NAMED
        try:
            self.bus.send(CONTROLLER_QUEUE, QueueLeft(job_ids=[] if many else job_ids, resync=many))
        except Exception as exc:
            event(
                log,
                "cancel_notify_failed",
                logging.WARNING,
                jobs=len(job_ids),
                error=exc,
                effect="dropped from the controller's queue at its next full resync",
            )

    def _stop(self, job_id: str, node: str, attempt: int) -> None:
        stop_attempt(self.bus, job_id, attempt, [node], "cancelled by user", self.settings.agent.stop_grace_s)

    # -- nodes -------------------------------------------------------------------------

    def cordon(self, name: str, reason: str = "", who: str = "") -> Node:
        """No new jobs on ``name``; running ones are untouched. Idempotent. ``who``: for the record."""
        self._nodes.set_state(name, NodeState.CORDONED, reason or "cordoned", time.time(), who or _who())
        return self._nodes.get(name)

    def uncordon(self, name: str, who: str = "") -> Node:
        """Back to READY (also ends a drain)."""
        self._nodes.set_state(name, NodeState.READY, "uncordoned", time.time(), who or _who())
        self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=name))
        return self._nodes.get(name)

    def drain(
        self,
        names: Sequence[str],
        *,
        deadline_s: float = 3600.0,
        grace_s: float = 60.0,
        force: bool = False,
        reason: str = "",
        who: str = "",
    ) -> list[Node]:
        """Cordon every node first (so work does not hop onto the next one), then drain them.

        Running jobs may finish until the deadline (``force``: now); then each gets SIGTERM and
        ``grace_s`` to checkpoint, and is requeued elsewhere without spending its retries.
        """
        for name in names:
            self._nodes.get(name)  # all exist before any changes
        now, who = time.time(), who or _who()
        for name in names:
            self._nodes.set_state(name, NodeState.CORDONED, reason or "cordoned for drain", now, who)
        deadline = now if force else now + deadline_s
        for name in names:
            self._nodes.set_state(
                name,
                NodeState.DRAINING,
                reason or "draining",
                now,
                who,
                drain_deadline=deadline,
                drain_grace_s=grace_s,
            )
            self.bus.send(CONTROLLER_QUEUE, NodeChanged(node=name))
        return [self._nodes.get(name) for name in names]


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _clip(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
