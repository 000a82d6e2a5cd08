"""Elastic jobs without Redis: the spec's ranges and their errors, sizes and batches, the elastic step's
decisions, and a resize's end (requeued at the new size, no retry spent)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fleet.api.admission import check_elastic
from fleet.config_sections import ControllerSettings
from fleet.controller.elasticity import Elasticity
from fleet.errors import SpecError
from fleet.keys import Keys
from fleet.lifecycle import RetryPolicy, decide
from fleet.models import PROFILES, Exit, ExitKind, Fault, Job, JobSpec, JobState, Range
from fleet.scheduler import GpuSlot, NodeView, PendingJob, PendingQueue
from fleet.scheduler import profiles as policy
from fleet.scheduler.passes import PassInput, PassPlan, PassSettings, run_pass
from fleet.scheduler.resizing import Elastic, Resize, _job, elastic_gpus
from fleet.scheduler.resizing import decide as decide_sizes
from fleet.scheduler.sizing import Size, fit_batch, scaled_batch
from fleet.state.profiles import ProfileStore

ELASTIC = {
    "name": "e",
    "command": ["python", "train.py"],
    "gpus": {"min": 1, "max": 4},
    "batch_size": {"min": 128, "max": 1024},
    "profile": "cifar10",
}
#: bundled profiles only: never reads the store
BUNDLED = ProfileStore(None, Keys(), 1.0)


# -- the spec ----------------------------------------------------------------------------------


def test_an_elastic_spec_takes_ranges_as_objects_or_text_and_is_stored_as_given() -> None:
    spec = JobSpec.parse({**ELASTIC, "gpus": "1-4", "batch_size": "128 - 1024"})
    assert spec.elastic and spec.gpus == Range(min=1, max=4) and spec.batch_size == Range(min=128, max=1024)
    assert (spec.min_gpus, spec.max_gpus) == (1, 4)
    stored = json.loads(spec.model_dump_json())
    assert stored["gpus"] == {"min": 1, "max": 4}
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


def test_a_plain_spec_is_stored_as_before_and_an_old_record_reads_back() -> None:
    old = '{"name": "j", "command": ["x"], "gpus": 2, "priority": 0}'  # written before elastic jobs
    spec = JobSpec.model_validate_json(old)
    assert (spec.gpus, spec.elastic, spec.batch_size, spec.profile) == (2, False, None, None)
    assert json.loads(spec.model_dump_json())["gpus"] == 2
    assert Job(id="j", spec=spec, state=JobState.QUEUED).gpu_count == 2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": 2}, "batch_size: a range of batch sizes needs a range of GPUs too"),
        ({"gpus": 2, "batch_size": 64}, "profile: only an elastic job (gpus: {min, max}) uses a scaling"),
        ({"batch_size": None}, "batch_size: an elastic job needs its global batch size"),
        (
            {"profile": None},
            "profile: an elastic job needs a scaling profile: one fleet ships (bert, cifar10",
        ),
        (
            {"profile": "resnet"},
            "(got 'resnet'): one fleet ships (bert, cifar10, deepspeech2, imagenet, ncf, yolov3), 'learn'",
        ),
        ({"profile": "resnet"}, "(got 'resnet')"),
        ({"nodes": 2}, "nodes: an elastic job's size is fleet's to choose; drop nodes"),
        ({"gpus": {"min": 4, "max": 2}}, "gpus: min (4) is above max (2)"),
        ({"gpus": {"min": 0, "max": 2}}, "gpus.min: Input should be greater than or equal to 1"),
        ({"gpus": {"min": 1}}, "gpus.max: is required"),
        ({"batch_size": {"min": 1, "max": 8, "step": 2}}, "batch_size.step: unknown field"),
        ({"gpus": "one-four"}, "gpus: Input should be a valid integer"),
    ],
)
def test_a_bad_elastic_spec_names_the_field_and_the_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.parse({**ELASTIC, **fields})
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"batch_size": {"min": 16, "max": 64}},
            "with a global batch of 16-64 (it was measured at batch sizes 128",
        ),
        ({"batch_size": 64}, "with a global batch of 64 (it was measured"),
        ({"gpus": {"min": 100, "max": 200}}, "at 100-200 GPUs"),
    ],
)
def test_an_elastic_job_its_profile_gives_no_size_to_run_at_is_refused_at_submit(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match="widen the ranges or choose another profile") as err:
        check_elastic(JobSpec.parse({**ELASTIC, **fields}), BUNDLED)
    assert message in str(err.value)
    check_elastic(JobSpec.parse(ELASTIC), BUNDLED)  # the example's ranges run


def test_the_spec_names_the_profiles_the_policy_ships() -> None:
    assert PROFILES == policy.PROFILES


def test_the_cli_takes_ranges_for_gpus_and_batch_size() -> None:
    from fleet.cli.submit import spec_from_options, submit

    def spec(*argv: str) -> JobSpec:
        ctx = submit.make_context("submit", list(argv))
        return spec_from_options(ctx.params, ctx.meta["fleet.command"])

    elastic = spec(
        "--gpus", "1-4", "--batch-size", "128-1024", "--profile", "cifar10", "--", "python", "t.py"
    )
    assert (elastic.gpus, elastic.batch_size) == (Range(min=1, max=4), Range(min=128, max=1024))
    assert elastic.profile == "cifar10"
    assert spec("--gpus", "2", "--", "x").gpus == 2


# -- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "gpus", "low", "high", "fitted"),
    [
        (725, 1, 128, 1024, 725),
        (725, 2, 128, 1024, 724),
        (1024, 3, 128, 1024, 1023),
        (100, 4, 128, 1024, 128),
        (130, 4, 129, 130, 130),
        (5000, 4, 128, 1024, 1024),
    ],
)
def test_a_batch_splits_evenly_over_the_gpus_within_its_range(
    batch: int, gpus: int, low: int, high: int, fitted: int
) -> None:
    assert fit_batch(batch, gpus, low, high) == fitted


def test_a_batch_scales_with_the_gpus_by_default() -> None:
    assert scaled_batch(128, 1, 2, 64, 512) == 256
    assert scaled_batch(256, 2, 4, 64, 400) == 400  # as far as the range goes
    assert scaled_batch(0, 0, 2, 64, 512) == 64  # not sized yet: the smallest


# -- the end of a resized attempt ---------------------------------------------------------------


def test_a_resize_requeues_at_once_spending_neither_a_retry_nor_the_infrastructure_cap() -> None:
    job = Job(
        id="e",
        spec=JobSpec.parse(ELASTIC),
        state=JobState.RUNNING,
        attempt=3,
        infra_requeues=2,
        resize_gpus=2,
        resize_batch=256,
    )
    why = "resized 1 -> 2 GPUs: exited with code 143 (SIGTERM)"
    exit = Exit(code=143, fault=Fault.INFRA, kind=ExitKind.RESIZE, reason=why)
    d = decide(job, exit, RetryPolicy(max_infra_requeues=2))
    assert (d.state, d.delay, d.incr) == (JobState.QUEUED, 0.0, {"resizes": 1})
    assert d.reason.endswith("requeued at its new size (retry budget not spent)")


# -- the elastic step ---------------------------------------------------------------------------


def node(name: str, holders: list[str], schedulable: bool = True) -> NodeView:
    gpus = tuple(
        GpuSlot(
            uuid=f"{name}-{i}", index=i, model="A100", memory_total=80 << 30, free=not holder, holder=holder
        )
        for i, holder in enumerate(holders)
    )
    return NodeView(name=name, schedulable=schedulable, gpus=gpus)


def test_elastic_jobs_get_what_fixed_size_jobs_neither_hold_nor_could_start_on() -> None:
    views = [node("a", ["e:1", "", "f:1", "f:1"]), node("b", ["", "", "", ""])]
    assert elastic_gpus(views, ["e"], []) == 6  # e's own GPU and the 5 free ones
    two, nine = PendingJob("q", 0, 1, gpus=2), PendingJob("big", 0, 2, gpus=9)
    assert elastic_gpus(views, ["e"], [two]) == 4  # a queued 2-GPU job would start: its 2 are not theirs
    assert elastic_gpus(views, ["e"], [nine]) == 6  # one that could not start even then takes nothing
    cordoned = [node("a", ["e:1", "", "", ""], schedulable=False)]
    assert elastic_gpus(cordoned, ["e"], []) == 1  # a cordon leaves running jobs be


def job(job_id: str, gpus: int = 0, running: bool = False, **fields: object) -> Elastic:
    size = Size(gpus, 725 if gpus == 1 else 726 if gpus else 0)
    cifar10 = policy.named_profile("cifar10")
    return Elastic(job_id, "t", 1, 4, 128, 1024, cifar10, size, running, **fields)  # type: ignore[arg-type]


def sizes(jobs: list[Elastic], gpus: int, now: float = 100.0) -> list[tuple[str, int, int]]:
    decided = decide_sizes(jobs, gpus, now, resize_cost_s=1, min_interval_s=10, gpus_per_node=4)
    return [(r.job_id, r.old.gpus, r.new.gpus) for r in decided]


def test_the_step_sizes_a_queued_job_grows_a_running_one_and_shrinks_it_for_others() -> None:
    assert sizes([job("q")], 1) == [("q", 0, 1)]
    assert sizes([job("r", 1, running=True)], 4) == [("r", 1, 4)]
    assert sizes([job("r", 4, running=True)], 2) == [("r", 4, 2)]
    assert sizes([job("r", 2, running=True)], 2) == []  # as it is: nothing to do


def test_the_step_waits_out_the_minimum_interval_and_leaves_a_stopping_job_be() -> None:
    assert sizes([job("r", 1, running=True, changed_at=95.0)], 4) == []
    stopping = job("s", 1, running=True, stopping=True, resize_to=3)
    assert sizes([stopping, job("q")], 4) == [("q", 0, 1)]  # s comes back with 3 of the 4


def test_with_the_step_off_a_queued_job_starts_at_its_smallest_and_keeps_it() -> None:
    steps = Elasticity(ControllerSettings(elastic=False), BUNDLED)
    queued = Job(id="q", spec=JobSpec.parse(ELASTIC), state=JobState.QUEUED)
    update = {"id": "r", "state": JobState.RUNNING, "num_gpus": 1, "batch_size": 128}
    running = queued.model_copy(update=update)
    steps.observe([queued, running])
    queue = PendingQueue([PendingJob("q", 0, 1, gpus=0, elastic=True, hold="unsized")])
    views = [node("a", ["r:1", "", "", ""])]

    def step() -> PassPlan:
        inp = PassInput(
            queue,
            views,
            {},
            {},
            {},
            {},
            PassSettings(elastic=False),
            steps.step_jobs(queue, 0.0),
            resize=True,
            place=False,
        )
        return run_pass(inp, 0.0)

    plan = step()
    assert plan.resizes == [Resize("q", Size(0, 0), Size(1, 128), False)]
    assert [(p.job_id, len(p.gpus)) for p in plan.placements] == [("q", 1)]  # this pass places it so
    # sized, it keeps that size (the running one too): a later step leaves both be
    steps.jobs["q"] = queued.model_copy(update={"num_gpus": 1, "batch_size": 128})
    queue.add(PendingJob("q", 0, 1, gpus=1, elastic=True))
    assert step().resizes == []


def test_the_step_weighs_jobs_by_the_gpu_seconds_their_attempts_ran() -> None:
    from fleet.state.records import parse_job

    # a job whose ended attempts ran 7,200 GPU-seconds and whose current one runs on 2 GPUs since
    # t=1,000, as its record holds it
    raw = {
        "id": "r",
        "state": "RUNNING",
        "spec": JobSpec.parse(ELASTIC).model_dump_json(),
        "num_gpus": "2",
        "batch_size": "256",
        "acct_gpu_s": "7200",
        "run_from": "1000",
    }
    running = parse_job(raw)
    assert running.attained_gpu_s(1_500.0) == 7_200 + 2 * 500
    requeued = parse_job({**raw, "state": "QUEUED"})  # between attempts: what the ended ones ran
    assert requeued.attained_gpu_s(1_500.0) == 7_200
    steps = Elasticity(ControllerSettings(), BUNDLED)
    steps.observe([running, Job(id="q", spec=JobSpec.parse(ELASTIC), state=JobState.QUEUED)])
    queue = PendingQueue([PendingJob("q", 0, 1, gpus=0, elastic=True, hold="unsized")])
    got = {e.id: e.attained for e in steps.step_jobs(queue, 1_500.0)}
    assert got == {"r": 8_200.0, "q": 0.0}
    # the controller's default weighs them (least attained service first)
    assert ControllerSettings().elastic_service_s > 0


def test_a_running_job_that_follows_its_batch_gets_its_best_batch_in_place() -> None:
    from fleet.scheduler.elastic import rate

    # Given a job running on 2 GPUs at batch 128, in its minimum interval (no restart allowed now),
    # whose noise scale says a larger batch makes more progress per second
    base = Elastic("r", "t", 1, 4, 128, 1024, policy.named_profile("cifar10"), Size(2, 128), True)
    now, running = 100.0, replace(base, changed_at=95.0, noise_scale=4096.0)

    def step(j: Elastic) -> list[Resize]:
        return decide_sizes([j], 2, now, resize_cost_s=30, min_interval_s=60, gpus_per_node=4)

    # When it does not follow a batch change while it runs: nothing happens until its interval ends
    assert step(running) == []
    # When it does: its batch changes at once, in place, on its 2 GPUs, to the one of most goodput
    (change,) = step(replace(running, follows_batch=True))
    assert change.in_place and change.running and change.old == Size(2, 128) and change.new.gpus == 2
    as_job = _job(running)
    best = max(rate(as_job, 2, b, 4) for b in range(128, 1025, 2))
    assert rate(as_job, 2, change.new.batch, 4) >= 0.99 * best > rate(as_job, 2, 128, 4)
    # And at that batch, nothing more changes
    assert step(replace(running, follows_batch=True, size=change.new)) == []
