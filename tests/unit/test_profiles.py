"""Scaling profiles sent as data (a user's own, in the profiles format) and learned from a job's
reports: what the elastic optimizer makes of them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from fleet.scheduler.elastic import ElasticJob, allocate, sizes
from fleet.scheduler.learned import LearnedProfile
from fleet.scheduler.profiles import PROFILES, from_data, named_profile, profile_data


@pytest.mark.parametrize("name", PROFILES)
def test_a_profile_sent_as_data_scales_as_the_original(name: str) -> None:
    original = named_profile(name)
    copy = from_data(json.loads(json.dumps(profile_data(original))))
    assert (copy.min_batch, copy.max_batch, copy.samples, copy.max_gpus) == (
        original.min_batch,
        original.max_batch,
        original.samples,
        original.max_gpus,
    )
    for gpus in (1, 2, 3, 4, 8, 16, original.max_gpus):
        assert copy.best(gpus) == original.best(gpus)


def small() -> dict[str, Any]:
    return {
        "min_batch": 32,
        "max_batch": 256,
        "placements": {"1": [[32, 0.1, 0], [64, 0.18, 0]], "2": [[32, 0.12, 0.02], [64, 0.2, 0.02]]},
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"min_batch": 0}, "profile.min_batch"),
        ({"max_batch": 16}, "profile.max_batch"),
        ({"placements": {}}, "profile.placements"),
        ({"placements": {"../x": [[32, 0.1, 0]]}}, "profile.placements['../x']"),
        ({"placements": {"1": [[32, -0.1, 0]]}}, "profile.placements['1']"),
        ({"placements": {"1": [[32, 0.1, 0.5]]}}, "profile.placements['1']"),
        ({"placements": {"1": [[32, 0.1, 0], [32, 0.2, 0]]}}, "one point per per-GPU batch"),
        ({"scalability": {"6": [[32, 0.1, 0]]}}, "profile.scalability['6']"),
        ({"epochs": "many"}, "profile.epochs"),
        ({"colour": "red"}, "unknown field 'colour'"),
        ({"placements": {"1": [[b, 0.1, 0] for b in range(1, 200)]}}, "a list of 1-128"),
        ({"placements": {str(n): [[32, 0.1, 0]] for n in range(1, 600)}}, "at most 512 curves"),
    ],
)
def test_a_bad_profile_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace(".", r"\.")):
        from_data({**small(), **change})


def learned(observed: dict[tuple[int, int], float], least: int = 1) -> ElasticJob:
    profile = LearnedProfile(name="learned", min_batch=64, max_batch=4096, least=least, observed=observed)
    return ElasticJob("j", "t", least, 16, 64, 4096, profile)


def test_a_job_with_no_reports_runs_at_its_smallest_size_only() -> None:
    assert [(g, b) for g, b, _ in sizes(learned({}))] == [(1, 64)]
    assert [(g, b) for g, b, _ in sizes(learned({}, least=2))] == [(2, 64)]


def test_a_learned_job_is_tried_at_twice_the_gpus_it_ran_at_and_batch_per_gpu_it_ran_at() -> None:
    job = learned({(1, 64): 100.0})
    assert allocate([job], 16, now=0.0) == {"j": (2, 128)}
    grown = learned({(1, 64): 100.0, (2, 128): 195.0})
    assert allocate([grown], 16, now=0.0) == {"j": (4, 256)}


def test_a_job_slower_on_more_gpus_is_not_given_more() -> None:
    slower = learned({(1, 64): 100.0, (2, 128): 90.0})
    assert allocate([slower], 16, now=0.0)["j"] == (1, 64)


def test_a_job_that_gained_from_its_last_doubling_is_tried_at_the_next() -> None:
    # Given what cifar10 made in Pollux's simulator at 1, 2, 4 and 8 GPUs as its batch grew (its
    # step's synchronisation looks to grow from 4 to 8 GPUs, and it still ran faster on 8)
    seen = {(1, 128): 1241.0, (2, 278): 2274.0, (4, 864): 5011.0, (8, 3312): 9370.0}
    profile = LearnedProfile(
        name="learned", min_batch=128, max_batch=4096, least=1, max_local=1024, observed=seen
    )
    job = ElasticJob("j", "t", 1, 64, 128, 4096, profile, gpus=8, batch=3312, changed_at=0.0)
    # Then past the largest count it ran at, its synchronisation is taken as there (nothing seen says
    # more): it is tried at twice the GPUs (along the growth from 4 to 8, 16 looked slower than 8)
    assert allocate([job], 64, now=1000.0) == {"j": (16, 4096)}
    # And a job that did not gain from its last doubling is not pushed further
    stalled = replace(profile, observed={**seen, (8, 3312): 4900.0})
    assert allocate([replace(job, profile=stalled)], 64, now=1000.0)["j"][0] < 8


def test_learned_jobs_share_gpus_by_how_well_each_scales() -> None:
    good = learned({(1, 64): 100.0, (2, 128): 198.0, (4, 256): 390.0})
    poor = learned({(1, 64): 100.0, (2, 128): 120.0, (4, 256): 125.0})
    got = allocate([poor, replace(good, id="good")], 6, now=0.0)
    assert (got["good"][0], got["j"][0]) == (4, 2)


def test_a_running_job_no_faster_than_at_a_smaller_size_gives_the_gpus_back() -> None:
    # it was tried at 2 GPUs and was no faster there: with 16 GPUs free and nobody wanting them
    # it still goes back to 1 (once its minimum interval is over)
    flat = replace(learned({(1, 64): 100.0, (2, 128): 100.0}), gpus=2, batch=128, changed_at=0.0)
    assert allocate([flat], 16, now=1000.0, min_interval_s=120) == {"j": (1, 64)}
    assert allocate([flat], 16, now=60.0, min_interval_s=120) == {"j": (2, 128)}  # not yet


def test_a_declared_largest_batch_per_gpu_lets_a_learning_job_try_larger_ones() -> None:
    profile = LearnedProfile(
        name="learned", min_batch=64, max_batch=4096, least=1, max_local=256, observed={(1, 64): 100.0}
    )
    job = ElasticJob("j", "t", 1, 16, 64, 4096, profile)
    # in this model a larger batch is never slower: it takes the largest a GPU may hold
    assert [(g, b) for g, b, _ in sizes(job)] == [(1, 256), (2, 512)]


def test_a_learning_job_with_a_declared_largest_batch_per_gpu_starts_at_its_tuned_batch() -> None:
    # nothing reported yet: the batch it was tuned at, not the largest that fits (a larger batch
    # may cost statistical efficiency, which only its reports tell; Pollux starts there too)
    profile = LearnedProfile(name="learned", min_batch=64, max_batch=4096, least=1, max_local=256)
    assert [(g, b) for g, b, _ in sizes(ElasticJob("j", "t", 1, 16, 64, 4096, profile))] == [(1, 64)]


def test_a_learned_profile_separates_a_steps_fixed_cost_from_its_cost_per_sample() -> None:
    # Given reports from a job whose step takes 0.2 s + 1 ms a sample on each GPU, plus 50 ms of
    # synchronisation on 2 GPUs and 80 ms on 4
    def rate(gpus: int, batch: int) -> float:
        return batch / (0.2 + 0.001 * batch / gpus + {1: 0.0, 2: 0.05, 4: 0.08}[gpus])

    sizes_run = [(1, 64), (1, 256), (2, 512), (4, 1024)]
    profile = LearnedProfile(
        name="learned",
        min_batch=64,
        max_batch=4096,
        least=1,
        max_local=256,
        observed={size: rate(*size) for size in sizes_run},
    )
    # Then a size it never ran at, a finer split on 4 GPUs, is predicted within 2 %: a model without
    # the fixed cost would say 4 GPUs at 128 each are twice as fast as at 256 each
    assert profile.throughput(4, 512) == pytest.approx(rate(4, 512), rel=0.02)
    assert profile.throughput(4, 512) < 0.8 * profile.throughput(4, 1024)


def test_a_learned_fixed_batch_is_split_finer_at_what_its_fixed_cost_allows() -> None:
    # one report, one GPU at 512: half of its step counted as fixed (Pollux's prior), so 4 GPUs at 128
    # each are worth 1.6x, not 4x; nothing is known of their synchronisation yet (optimistic: none)
    fixed = LearnedProfile(name="learned", min_batch=512, max_batch=512, least=1, observed={(1, 512): 100.0})
    assert fixed.throughput(4, 512) == pytest.approx(160.0)


def test_a_learned_job_reaches_a_batch_larger_than_fits_by_accumulation_when_sized_by_goodput() -> None:
    # one report: 1 GPU at 8 a GPU, all that fits; 0.5 s a step, half of it fixed (Pollux's prior)
    profile = LearnedProfile(
        name="learned", min_batch=8, max_batch=512, least=1, max_local=8, observed={(1, 8): 16.0}
    )
    assert profile.throughput(1, 32) == 0.0  # 32 a GPU does not fit in one pass
    # four micro-batches of 8 and one optimizer step: four times the compute, no more synchronisation
    assert profile.throughput(1, 32, accumulate=True) == pytest.approx(32 / (4 * 0.5))
    assert profile.throughput(2, 64, accumulate=True) == pytest.approx(64 / (4 * 0.5))  # none seen yet


def test_a_learned_sync_stays_at_its_one_measured_count_until_a_second_says_how_it_grows() -> None:
    # Given 1 and 2 GPUs run at 64 a GPU (2 GPUs: 10 % slower a step)
    one = LearnedProfile(
        name="learned", min_batch=64, max_batch=4096, least=1, observed={(1, 64): 100.0, (2, 128): 180.0}
    )
    # Then 4 GPUs at 64 each are expected to synchronise as 2 do (Pollux: no growth seen yet)
    assert one.throughput(4, 256) == pytest.approx(360.0)
    # and once 4 GPUs were seen to synchronise slower still but run faster than 2, 8 are expected to
    # synchronise as 4 do; had 4 run no faster than 2, 8 would follow the line through 2 and 4
    two = replace(one, observed={**one.observed, (4, 256): 320.0})
    assert two.throughput(8, 512) == pytest.approx(2 * 320.0, rel=1e-6)
    stalled = replace(one, observed={**one.observed, (4, 256): 170.0})
    step = {g: 64 * g / stalled.observed[g, 64 * g] for g in (2, 4)}
    assert stalled.throughput(8, 512) == pytest.approx(512 / (3 * step[4] - 2 * step[2]), rel=1e-6)


def test_a_learned_sync_across_nodes_is_learned_apart_from_within_one() -> None:
    # Given 1, 2 and 4 GPUs on one node of 4, each faster than the last
    within = {(1, 64): 100.0, (2, 128): 190.0, (4, 256): 360.0}
    one = LearnedProfile(name="learned", min_batch=64, max_batch=4096, least=1, observed=within)
    step = {g: 64 * g / rate for (g, _), rate in within.items()}
    # Then 8 GPUs (two nodes) are expected to synchronise as 4 do (Pollux's prior), optimistic
    assert one.throughput(8, 512, gpus_per_node=4) == pytest.approx(512 / step[4], rel=1e-6)
    # and once 8 ran slower than 4 (a slow link between nodes), 16 are expected to synchronise as 8
    # did, not along the line from 4 to 8: across nodes is a term of its own, with no growth seen yet
    slow = replace(one, observed={**within, (8, 512): 240.0})
    assert slow.throughput(16, 1024, gpus_per_node=4) == pytest.approx(2 * 240.0, rel=1e-6)
    assert slow.throughput(16, 1024, gpus_per_node=4) > one.throughput(4, 256, gpus_per_node=4)
    # within a node the counts across nodes say nothing: 3 GPUs sit between 2 and 4
    assert slow.throughput(3, 192, gpus_per_node=4) == pytest.approx(
        192 / ((step[2] + step[4]) / 2), rel=0.02
    )
    # on nodes of 8 GPUs the same 8 ran on one node and gained nothing over 4: 16, never run across
    # nodes, follow the line through 4 and 8 within one
    step[8] = 512 / 240.0
    assert slow.throughput(16, 1024, gpus_per_node=8) == pytest.approx(
        1024 / (3 * step[8] - 2 * step[4]), rel=1e-6
    )


def test_max_batch_per_gpu_caps_a_measured_profile_and_is_refused_when_nothing_fits() -> None:
    from fleet.api.admission import check_elastic
    from fleet.errors import SpecError
    from fleet.keys import Keys
    from fleet.models import JobSpec
    from fleet.state.profiles import ProfileStore

    store = ProfileStore(None, Keys(), 1.0)  # bundled and learned profiles never read Redis
    base = {"name": "e", "command": ["x"], "gpus": "1-8", "batch_size": "128-4096", "profile": "cifar10"}
    capped = store.profile_of(JobSpec.parse({**base, "max_batch_per_gpu": 200}))
    assert capped.max_local == 200 and named_profile("cifar10").max_local is None  # the bundled one untouched
    for gpus in (1, 2, 4, 8):
        _, batch = capped.best(gpus)
        assert 0 < batch <= 200 * gpus
    assert store.profile_of(JobSpec.parse({**base, "max_batch_per_gpu": 200})) is capped  # worked out once
    with pytest.raises(SpecError, match="max_batch_per_gpu 10: 128 on 8 GPUs is more per GPU"):
        check_elastic(JobSpec.parse({**base, "max_batch_per_gpu": 10}), store)
    learn = {**base, "profile": "learn", "gpus": "2-8", "max_batch_per_gpu": 32}
    with pytest.raises(SpecError, match="a global batch of 128-4096 on 2 GPUs is more than 32 per GPU"):
        check_elastic(JobSpec.parse(learn), store)
    with pytest.raises(SpecError, match=r"max_batch_per_gpu: only an elastic job \(gpus: \{min, max\}\)"):
        JobSpec.parse({"name": "f", "command": ["x"], "gpus": 1, "max_batch_per_gpu": 64})
