"""The elastic policy by goodput (jobs with a noise scale), weighted by attained service, and
``fleet sim``'s goodput model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.scheduler.elastic import SERVICE_FLOOR, SPEEDUP, allocate, service_weight, sizes
from fleet.scheduler.goodput import efficiency
from fleet.scheduler.profiles import Profile, named_profile
from fleet.sim import SimConfig, Simulation, TraceJob
from tests.unit.test_elastic import curve, job, linear


def test_a_small_noise_scale_gets_a_smaller_batch_and_no_more_gpus_than_a_large_one() -> None:
    p = linear(efficiency=0.9, min_batch=8, max_batch=64)
    early = allocate([job("j", p, noise_scale=4.0)], 8, now=0.0)["j"]
    late = allocate([job("j", p, noise_scale=100_000.0)], 8, now=0.0)["j"]
    assert early[1] < late[1] and early[0] <= late[0], (early, late)
    assert late == (8, 64)  # a large noise scale: every sample counts, as by samples/s
    # without a noise scale nothing changes: samples/s decide
    assert allocate([job("j", p)], 8, now=0.0)["j"] == (8, 64)


def test_a_batch_past_what_fits_a_gpu_is_reached_by_gradient_accumulation() -> None:
    # per-GPU batches of 1-16 measured (half of a step at 4 spent synchronising), 4 fit a GPU: by
    # samples/s (no accumulation asked for) a 1-GPU job stays at 4
    steps = curve({b: 0.1 + 0.01 * b for b in (1, 2, 4, 8, 16)}, sync=0.07)
    small = Profile("small", 2, 16, 1, 1000, max_local=4, placements={(1,): steps})
    assert allocate([job("j", small, max_gpus=1)], 1, now=0.0) == {"j": (1, 4)}
    # with a large noise scale the larger batch is worth its samples: 16 as 4 micro-batches of 4
    assert allocate([job("j", small, max_gpus=1, noise_scale=1e6)], 1, now=0.0) == {"j": (1, 16)}


def test_attained_service_weighs_new_jobs_first() -> None:
    assert service_weight(0.0, 3600.0) == 1.0
    assert service_weight(3600.0, 3600.0) == 0.5 > service_weight(7200.0, 3600.0)
    assert service_weight(1e9, 0.0) == 1.0  # off
    assert service_weight(1e9, 3600.0) == SERVICE_FLOOR == service_weight(1e12, 3600.0)
    p = linear(efficiency=0.9)
    old = job("old", p, max_gpus=2, attained=36_000.0)
    new = job("new", p, max_gpus=2)
    # 3 GPUs for two equal jobs: the third goes to the one with the least attained service
    for jobs in ([old, new], [new, old]):
        plan = allocate(jobs, 3, now=0.0, objective=SPEEDUP, service_s=3600.0)
        assert plan["new"][0] == 2 and plan["old"][0] == 1, plan


def test_a_job_that_ran_for_ages_still_gets_a_gpu_it_uses_far_better_than_a_new_one() -> None:
    # a job that has had a million GPU-seconds scales almost linearly; a new one gains 5 % from a
    # second GPU: the floor keeps the old one's 90 % gain worth more than the new one's 5 %
    old = job("old", linear(efficiency=0.9), max_gpus=2, attained=1e6)
    new = job("new", linear("flat", efficiency=0.05), max_gpus=2)
    for jobs in ([old, new], [new, old]):
        plan = allocate(jobs, 3, now=0.0, objective=SPEEDUP, service_s=3600.0)
        assert plan["old"][0] == 2 and plan["new"][0] == 1, plan


def test_no_resize_by_goodput_unless_the_gain_pays_for_the_restart() -> None:
    # a second GPU adds 2 % of goodput: not worth a restart, even a free one
    p = linear(efficiency=0.02, min_batch=8, max_batch=64)
    gpus, batch, _ = sizes(job("j", p, max_gpus=1, noise_scale=1e6))[0]
    running = job("j", p, gpus=gpus, batch=batch, max_gpus=2, noise_scale=1e6)
    assert allocate([running], 2, now=10_000.0) == {"j": (gpus, batch)}
    assert allocate([running], 2, now=10_000.0, resize_cost_s=0.0) == {"j": (gpus, batch)}
    # 50 %: worth 30 s of a restart
    fast = replace(running, profile=linear(efficiency=0.5, min_batch=8, max_batch=64))
    assert allocate([fast], 2, now=10_000.0)["j"][0] == 2
    # a noise scale grown since it started: a larger batch on its GPU pays only if enough better
    assert allocate([running], 1, now=10_000.0)["j"] == (gpus, batch)


def test_sim_progress_counts_samples_at_their_efficiency_epoch_by_epoch() -> None:
    trace = TraceJob("c", "t", 0.0, gpus=4, batch=512, model="cifar10")
    cifar = named_profile("cifar10")
    speed = cifar.throughput(4, 512)
    goodput = Simulation([trace], SimConfig("fifo", gpus=8)).run()
    want = sum(cifar.epoch_samples / (speed * efficiency(512, b, cifar.min_batch)) for b in cifar.noise)
    assert len(cifar.noise) == cifar.epochs and goodput.jct.mean == pytest.approx(want)
    throughput = Simulation([trace], SimConfig("fifo", gpus=8, model="throughput")).run()
    assert throughput.jct.mean == pytest.approx(cifar.samples / speed)
    assert throughput.jct.mean < want


def test_sim_sizes_elastic_jobs_by_goodput_and_sees_the_batch_grow() -> None:
    trace = TraceJob("c", "t", 0.0, gpus=4, batch=512, model="cifar10")
    sim = Simulation([trace], SimConfig("elastic", gpus=16))
    batches = []
    original = sim._rerate

    def rerate(j):  # type: ignore[no-untyped-def]
        batches.append(j.batch)
        original(j)

    sim._rerate = rerate  # type: ignore[method-assign]
    r = sim.run()
    assert r.completed == 1
    # it starts near the batch it was tuned at (a small noise scale early) and ends far above it
    assert batches[0] < 4 * cifar_min() and max(batches) > 8 * cifar_min(), batches
    with pytest.raises(ValueError, match="model"):
        SimConfig("elastic", model="samples").check()


def cifar_min() -> int:
    return named_profile("cifar10").min_batch


def test_the_profiles_carry_the_noise_scale_per_epoch() -> None:
    for name in ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"):
        p = named_profile(name)
        assert p.noise and all(b >= 0 for b in p.noise), name
        assert p.noise_scale(0.0) == p.noise[0] and p.noise_scale(p.samples * 10) == p.noise[-1]
    cifar = named_profile("cifar10")
    assert cifar.noise[-1] > 10 * cifar.noise[1]  # it grows as training goes on
    made_up = Profile("m", 1, 8, placements={(1,): curve({1: 0.1, 8: 0.2})})
    assert made_up.noise_scale(0.0) is None
