"""What this fleet admits: a spec's mounts, image, webhook, user and elastic profile, and the size a
resize asks for. Each refusal is a :class:`SpecError` naming the field and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleet import webhooks
from fleet.config import Settings
from fleet.errors import SpecError
from fleet.models import Dependency, Job, JobArray, JobSpec, JobState, Range, Webhook
from fleet.models.arrays import task_ids
from fleet.models.parts import AFTER_MAX
from fleet.mounts import check_mounts
from fleet.registries import check_image
from fleet.scheduler.sizing import Size, scaled_batch
from fleet.state.jobs import JobStore
from fleet.state.profiles import ProfileStore
from fleet.state.tenants import TenantStore


def admit(
    spec: JobSpec | dict[str, Any],
    settings: Settings,
    tenants: TenantStore,
    profiles: ProfileStore,
    jobs: JobStore,
    named: Named | None = None,
) -> JobSpec:
    """The spec, if this fleet runs it: mounts, image registry, webhook address, the tenant's
    allowed users and an elastic job's profile checked; :class:`SpecError` naming what is not.
    ``named``: the jobs ``after`` names, read once for a batch of specs."""
    if isinstance(spec, dict):
        spec = JobSpec.parse(spec)
    check_mounts(spec.mounts, settings.allowed_mounts)
    check_image(spec.image or settings.default_image, settings.allowed_registries)
    check_webhook(spec.notify, settings)
    check_user(spec, tenants)
    check_elastic(spec, profiles)
    return with_dependencies(spec, jobs, named)


class Named:
    """The jobs and arrays specs' ``after`` entries name, each read once (a batch of specs waiting
    for one job reads it once, not once a spec): its tenant (None: there is none), an array's record."""

    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self.tenants: dict[str, str | None] = {}
        self.arrays: dict[str, JobArray] = {}

    def read(self, ids: Iterable[str]) -> None:
        new = set(ids) - self.tenants.keys()
        if not new:
            return
        found = {j.id: j.spec.tenant for j in self.jobs.get_many(new)}
        arrays = self.jobs.arrays(new - found.keys())
        self.arrays.update(arrays)
        for job_id in new:
            self.tenants[job_id] = found.get(job_id) or (
                arrays[job_id].spec.tenant if job_id in arrays else None
            )


def with_dependencies(spec: JobSpec, jobs: JobStore, named: Named | None = None) -> JobSpec:
    """The spec with each job it waits for checked: it exists in the spec's tenant (another tenant's
    job is refused as an unknown one is, naming it), and an array's id stands for all its tasks."""
    if not spec.after:
        check_inputs(spec)
        return spec
    named = named or Named(jobs)
    named.read(d.job for d in spec.after)
    after = []
    for dep in spec.after:
        if named.tenants[dep.job] != spec.tenant:
            raise SpecError(
                f"after: no job or array {dep.job!r} in tenant {spec.tenant!r}; "
                "a job can only wait for jobs of its own tenant that were already submitted"
            )
        array = named.arrays.get(dep.job)
        tasks = task_ids(dep.job, array.indices) if array is not None else [dep.job]
        after += [Dependency(job=t, when=dep.when) for t in tasks]
    if len(after) > AFTER_MAX:
        raise SpecError(
            f"after: {len(after)} jobs counting each array's tasks, more than {AFTER_MAX}; "
            "wait for fewer jobs, or split the arrays"
        )
    spec = spec.model_copy(update={"after": after})
    check_inputs(spec)
    return spec


def check_inputs(spec: JobSpec) -> None:
    """A call takes as arguments the results of jobs it waits to succeed, and only those: the node
    hands it their outcomes once they have (``call.inputs``, each in ``after`` with ``when: ok``)."""
    waited = {dep.job for dep in spec.after if dep.when == "ok"}
    for job_id in spec.call.inputs if spec.call is not None else ():
        if job_id not in waited:
            raise SpecError(
                f"call.inputs: job {job_id!r} is not in after with when ok; a call takes the result of "
                f"a job it waits to succeed: add {job_id}:ok to after (fleet.function's submit does)"
            )


def check_webhook(hook: Webhook | None, settings: Settings) -> None:
    """:class:`SpecError` for a webhook whose host is written as an address fleet never sends to."""
    if hook is None:
        return
    try:
        webhooks.check_url(hook.url, webhooks.networks(settings.webhook_allowed_networks))
    except webhooks.AddressRefused as exc:
        raise SpecError(str(exc)) from None


def check_user(spec: JobSpec, tenants: TenantStore) -> None:
    """:class:`SpecError` for a spec's ``user`` its tenant's ``allowed_users`` does not hold."""
    if spec.user is not None:
        tenants.policy(spec.tenant).check_user(spec.user)


def check_elastic(spec: JobSpec, profiles: ProfileStore) -> None:
    """An elastic job its profile gives no size to run at would wait forever: refused at submit, as is
    one whose uploaded profile is not stored or not a profile."""
    if not isinstance(spec.gpus, Range) or spec.batch_size is None or spec.profile is None:
        return
    from fleet.scheduler.resizing import Elastic, unrunnable  # numpy: only for elastic jobs

    job = Job(id="", spec=spec, state=JobState.QUEUED)
    if why := unrunnable(Elastic.of(job, profiles.profile_of(spec, touch=True))):
        raise SpecError(f"invalid job spec:\n  spec: {why}")


def resize_target(job: Job, gpus: int, batch: int | None) -> Size:
    """The size a resize asks for, checked against the job's ranges (a :class:`SpecError` names the
    field and what is allowed) and where it stands (queued or running, not leaving its node)."""
    spec = job.spec
    if not isinstance(spec.gpus, Range):
        raise SpecError(
            f"job {job.id} is not elastic: only a job submitted with a range of GPUs "
            "(gpus: {min, max}, fleet submit --gpus 1-4) can be resized"
        )
    if job.state.final:
        raise SpecError(f"job {job.id} is {job.state.value}: only a queued or running job can be resized")
    if job.resize_gpus is not None or job.preempt or job.cancel_requested:
        raise SpecError(
            f"job {job.id} is already leaving its node ({job.preempt or 'cancelled'}); "
            "resize it once it is queued again"
        )
    if not spec.gpus.min <= gpus <= spec.gpus.max:
        raise SpecError(f"gpus: {gpus} is outside job {job.id}'s range {spec.gpus}")
    low, high = (
        (spec.batch_size.min, spec.batch_size.max)
        if isinstance(spec.batch_size, Range)
        else ((spec.batch_size, spec.batch_size) if spec.batch_size else (1, 1 << 24))
    )
    if batch is None:
        return Size(gpus, scaled_batch(job.global_batch or 0, job.gpu_count, gpus, low, high))
    if not low <= batch <= high:
        raise SpecError(f"batch size: {batch} is outside job {job.id}'s range {low}-{high}")
    return Size(gpus, batch)
