"""Goodput (throughput x statistical efficiency from the gradient noise scale) and the batch it picks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.models import Job, JobSpec, JobState
from fleet.scheduler.goodput import (
    Limits,
    best_batch,
    candidates,
    efficiency,
    from_profile,
    goodput,
    job_goodput,
    limits_of,
    micro_steps,
)
from fleet.scheduler.profiles import named_profile

noise = st.floats(min_value=0, max_value=1e6, allow_nan=False)
batches = st.integers(min_value=1, max_value=100_000)


@settings(max_examples=300, deadline=None)
@given(noise, batches, batches, batches)
def test_efficiency_is_in_0_1_one_at_the_initial_batch_and_falls_with_the_batch(
    gns: float, m0: int, a: int, b: int
) -> None:
    small, large = sorted((a, b))
    assert efficiency(m0, gns, m0) == 1.0
    assert 0 < efficiency(large, gns, m0) <= efficiency(small, gns, m0) <= 1.0


@settings(max_examples=200, deadline=None)
@given(noise, noise, batches, st.integers(min_value=2, max_value=64))
def test_a_larger_noise_scale_makes_a_larger_batch_worth_more(
    gns1: float, gns2: float, m0: int, k: int
) -> None:
    low, high = sorted((gns1, gns2))
    assert efficiency(m0 * k, high, m0) >= efficiency(m0 * k, low, m0)


def test_efficiency_matches_the_noise_scale_model() -> None:
    # B_noise = 1000, tuned at 100: at 1100 a sample is worth (1000 + 100) / (1000 + 1100)
    assert efficiency(1100, 1000.0, 100) == pytest.approx(1100 / 2100)
    # no noise scale measured: a larger batch buys nothing, goodput stays at the initial batch's
    assert efficiency(400, 0.0, 100) == pytest.approx(0.25)
    assert goodput(4000.0, 400, 0.0, 100) == pytest.approx(1000.0)


@pytest.mark.parametrize(("value", "field"), [(-1.0, "noise_scale"), (float("nan"), "noise_scale")])
def test_a_bad_noise_scale_is_refused_by_name(value: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        efficiency(256, value, 128)


def linear_model(compute: float, fixed: float, sync: float) -> object:
    """Step time: ``fixed + compute x local`` per micro-batch, plus ``sync`` x log2(GPUs) per step."""

    def rate(gpus: int, batch: int, steps: int) -> float:
        local = batch / gpus / steps
        return batch / (steps * (fixed + compute * local) + sync * (gpus - 1))

    return rate


models = st.builds(
    linear_model,
    st.floats(min_value=1e-5, max_value=1e-2),
    st.floats(min_value=1e-4, max_value=1.0),
    st.floats(min_value=0, max_value=0.5),
)


@settings(max_examples=150, deadline=None)
@given(models, st.integers(min_value=1, max_value=16), noise, noise, st.booleans())
def test_the_goodput_optimal_batch_grows_with_the_noise_scale(
    model: object, gpus: int, gns1: float, gns2: float, accumulate: bool
) -> None:
    limits = Limits(min_batch=32, max_batch=4096, max_local=128, accumulate=accumulate)
    low, high = sorted((gns1, gns2))
    a, b = best_batch(gpus, low, model, limits), best_batch(gpus, high, model, limits)  # type: ignore[arg-type]
    if a is None or b is None:
        assert a is None and b is None and not accumulate and gpus * 128 < 32
        return
    assert a.batch <= b.batch
    for choice in (a, b):
        assert 32 <= choice.batch <= 4096 and choice.local <= 128 and choice.steps >= 1
        assert choice.steps == 1 or accumulate


def test_a_small_noise_scale_keeps_the_initial_batch_and_a_large_one_takes_the_largest() -> None:
    model = linear_model(compute=1e-3, fixed=0.05, sync=0.0)
    limits = Limits(min_batch=64, max_batch=2048)
    assert best_batch(4, 0.0, model, limits).batch == 64  # type: ignore[arg-type, union-attr]
    assert best_batch(4, 1e9, model, limits).batch == 2048  # type: ignore[arg-type, union-attr]


def test_a_batch_larger_than_fits_is_reached_by_accumulation_or_not_at_all() -> None:
    # synchronising costs 0.5 s a step: more micro-batches per step pay for it when samples count fully
    model = linear_model(compute=1e-3, fixed=0.05, sync=0.5)
    fits = Limits(min_batch=64, max_batch=2048, max_local=256)
    accumulates = Limits(min_batch=64, max_batch=2048, max_local=256, accumulate=True)
    plain = best_batch(2, 1e9, model, fits)  # type: ignore[arg-type]
    accumulated = best_batch(2, 1e9, model, accumulates)  # type: ignore[arg-type]
    # on two GPUs: at most 2 x 256 in one pass, 2048 in 4 micro-batches of 256 each
    assert plain is not None and (plain.batch, plain.local, plain.steps) == (512, 256, 1)
    assert accumulated is not None
    assert (accumulated.batch, accumulated.local, accumulated.steps) == (2048, 256, 4)
    assert micro_steps(2048, 1, fits) is None and micro_steps(2048, 16, fits) == 1


def test_candidate_batches_split_evenly_over_the_gpus_within_the_range() -> None:
    found = candidates(8, Limits(min_batch=100, max_batch=3000))
    assert found[0] == 100 and found[-1] == 3000
    assert all(b % 8 == 0 for b in found[1:-1]) and found == sorted(set(found))


def test_a_bundled_profile_gives_a_goodput_optimal_batch_within_its_range() -> None:
    profile = named_profile("cifar10")
    limits = limits_of(profile)
    early, late = (best_batch(4, g, from_profile(profile), limits) for g in (0.0, 50_000.0))
    assert early is not None and late is not None
    assert early.batch == profile.min_batch < late.batch <= profile.max_batch
    assert late.goodput == pytest.approx(late.throughput * late.efficiency)


def test_a_stored_jobs_goodput_comes_from_its_reports_at_its_size() -> None:
    spec = JobSpec.parse(
        {"name": "e", "command": ["x"], "gpus": "1-4", "batch_size": "128-1024", "profile": "learn"}
    )
    sized = Job(
        id="e", spec=spec, state=JobState.RUNNING, num_gpus=2, batch_size=512, speeds={"2x512": 900.0}
    )
    # no noise scale reported: nothing to say (fleet show prints no Goodput line)
    assert job_goodput(sized) is None
    standing = job_goodput(sized.model_copy(update={"noise_scale": 384.0}))
    assert standing is not None
    assert standing.efficiency == pytest.approx((384 + 128) / (384 + 512))
    assert standing.goodput == pytest.approx(900.0 * standing.efficiency)
    assert str(standing) == (
        "noise scale 384 samples; efficiency 0.57 at batch 512 (tuned at 128); goodput 514.3 samples/s"
    )
    # no samples/s at its size yet: the efficiency without a goodput; not sized: nothing
    unmeasured = job_goodput(sized.model_copy(update={"noise_scale": 384.0, "speeds": {}}))
    assert unmeasured is not None and unmeasured.goodput is None and "goodput" not in str(unmeasured)
    assert (
        job_goodput(sized.model_copy(update={"noise_scale": 384.0, "num_gpus": 0, "batch_size": 0})) is None
    )
