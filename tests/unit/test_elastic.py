"""The elastic policy: profiles from the traces' format, and the optimizer (exact against brute force
on small cases, admission in order, hysteresis, minimum interval, fixed batch, tenants' caps)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.scheduler.elastic import COMPLETION, ElasticJob, _admit, allocate, options, restart_penalty, sizes
from fleet.scheduler.profiles import PROFILES, Profile, load_profile, named_profile


def curve(points: dict[int, float], sync: float = 0.0) -> tuple[tuple[float, ...], ...]:
    xs = tuple(float(x) for x in sorted(points))
    return (xs, tuple(points[int(x)] for x in xs), tuple(sync for _ in xs))


def linear(name: str = "lin", efficiency: float = 1.0, min_batch: int = 1, max_batch: int = 64) -> Profile:
    """A made-up model on 1-4 GPUs of one node (and 8 as 4+4): per-GPU batch 1-16, step time
    0.1 s + 0.01 s per sample; every added GPU is worth ``efficiency`` of the first."""
    per = {b: 0.1 + 0.01 * b for b in (1, 2, 4, 8, 16)}
    placements = {}
    for g in (1, 2, 3, 4):
        slow = 1.0 / (1.0 + (g - 1) * efficiency) * g  # step time factor so throughput scales so
        placements[(g,)] = curve({b: t * slow for b, t in per.items()})
    placements[(4, 4)] = curve({b: t * 8 / (1 + 7 * efficiency) for b, t in per.items()})
    return Profile(name, min_batch, max_batch, epochs=1, epoch_samples=1000, placements=placements)


def job(id: str, profile: Profile, **kw: object) -> ElasticJob:
    fields: dict[str, object] = {
        "min_gpus": 1,
        "max_gpus": 8,
        "min_batch": profile.min_batch,
        "max_batch": profile.max_batch,
    }
    fields.update(kw)
    return ElasticJob(id=id, tenant=str(fields.pop("tenant", "t")), profile=profile, **fields)  # type: ignore[arg-type]


# -- profiles -----------------------------------------------------------------------------


def test_the_bundled_profiles_load_with_their_batch_ranges_and_lengths() -> None:
    ranges = {p: (named_profile(p).min_batch, named_profile(p).max_batch) for p in PROFILES}
    assert ranges == {
        "bert": (12, 384),
        "cifar10": (128, 4096),
        "deepspeech2": (20, 640),
        "imagenet": (200, 12800),
        "ncf": (256, 32768),
        "yolov3": (8, 512),
    }
    cifar = named_profile("cifar10")
    assert cifar.epochs == 100 and cifar.epoch_samples == 391 * 128  # about 50k images
    assert cifar.max_gpus == 64
    with pytest.raises(ValueError, match="bundled are"):
        named_profile("resnet")


def test_throughput_is_measured_where_measured_and_interpolated_between() -> None:
    cifar = named_profile("cifar10")
    # placements.csv: "4,32,step" rows: 4 GPUs on one node at per-GPU batch 32 -> batch 128
    xs, steps, _ = cifar.placements[(4,)]
    assert cifar.throughput(4, 4 * int(xs[0])) == pytest.approx(4 * xs[0] / steps[0])
    mid = (xs[0] + xs[1]) / 2
    expected = 4 * mid / ((steps[0] + steps[1]) / 2)
    assert cifar.throughput(4, int(4 * mid)) == pytest.approx(expected, rel=1e-6)
    assert cifar.throughput(4, 64) == 0.0  # below the model's batch range
    assert cifar.throughput(1, 4096) == 0.0  # 4096 per GPU does not fit one GPU
    assert cifar.throughput(1, 4096, accumulate=True) > 0  # unless accumulated
    assert cifar.throughput(65, 4096) == 0.0  # more GPUs than ever measured
    assert cifar.throughput(6, 2048) > 0  # 2 x 3 on 4-GPU nodes, measured as "33"
    assert cifar.throughput(24, 4096) > 0  # from scalability.csv
    assert named_profile("yolov3").throughput(1, 16) == 0.0  # yolov3: at most 8 per GPU


def test_a_profile_loads_from_a_directory_in_the_traces_format(tmp_path: Path) -> None:
    (tmp_path / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,8,0.5,0.0\n1,16,1.0,0.0\n2,8,0.6,0.1\n11,8,0.9,0.4\n"
    )
    (tmp_path / "validation-8.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n100,100,1,1,1\n")
    (tmp_path / "validation-32.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n25,25,1,1,1\n")
    p = load_profile(tmp_path, "mine")
    assert (p.name, p.min_batch, p.max_batch, p.epoch_samples, p.epochs) == ("mine", 8, 32, 800, 1)
    assert p.throughput(1, 8) == pytest.approx(16.0) and p.throughput(1, 16) == pytest.approx(16.0)
    assert p.throughput(1, 12) == pytest.approx(12 / 0.75)
    assert p.throughput(2, 16) == pytest.approx(16 / 0.6)
    assert p.throughput(2, 16, gpus_per_node=1) == pytest.approx(16 / 0.9)  # one GPU per node: "11"


# -- the optimizer --------------------------------------------------------------------------


def brute_force(jobs: list[ElasticJob], gpus: int, now: float) -> float:
    """The best total value over every combination of the admitted jobs' options."""
    admitted = _admit(jobs, gpus, {}, now, 300.0, 4)
    choices = [options(j, now, gpus) for j in admitted]
    best = -math.inf
    for combo in itertools.product(*choices):
        if sum(g for g, _, _ in combo) <= gpus:
            best = max(best, sum(v for _, _, v in combo))
    return best


def value_of(jobs: list[ElasticJob], gpus: int, now: float, plan: dict[str, tuple[int, int]]) -> float:
    total = 0.0
    for j in _admit(jobs, gpus, {}, now, 300.0, 4):
        total += next(v for g, b, v in options(j, now, gpus) if (g, b) == plan[j.id])
    return total


@pytest.mark.parametrize("seed", range(12))
def test_the_dynamic_program_finds_the_brute_force_optimum(seed: int) -> None:
    import random

    rng = random.Random(seed)
    models = [linear("a", 0.9), linear("b", 0.5), linear("c", 0.2), named_profile("cifar10")]
    jobs = []
    for i in range(rng.randint(2, 5)):
        p = rng.choice(models)
        running = rng.random() < 0.5
        g = rng.choice([1, 2, 4]) if running else 0
        batch = p.best(g)[1] if running else 0
        jobs.append(
            job(
                f"j{i}",
                p,
                gpus=g,
                batch=batch,
                changed_at=rng.choice([0.0, 900.0]),
                min_gpus=1,
                max_gpus=rng.choice([2, 4, 8]),
            )
        )
    gpus = rng.randint(2, 12)
    plan = allocate(jobs, gpus, now=1000.0)
    assert sum(g for g, _ in plan.values()) <= gpus
    assert value_of(jobs, gpus, 1000.0, plan) == pytest.approx(brute_force(jobs, gpus, 1000.0))


def test_sizes_beyond_a_node_are_whole_nodes_and_each_one_is_faster() -> None:
    p = named_profile("imagenet")
    found = sizes(job("j", p, max_gpus=64))
    gs = [g for g, _, _ in found]
    assert all(g <= 4 or g % 4 == 0 for g in gs) and gs[0] == 1
    assert all(b[2] > a[2] for a, b in itertools.pairwise(found))


def test_waiting_jobs_start_in_order_before_any_job_grows() -> None:
    p = linear(efficiency=0.9)
    jobs = [job(f"j{i}", p) for i in range(6)]
    plan = allocate(jobs, 4, now=0.0)
    assert [plan[f"j{i}"][0] for i in range(6)] == [1, 1, 1, 1, 0, 0]
    # a big first job that does not fit does not hold up smaller ones behind it (backfill)
    jobs = [job("big", p, min_gpus=8), job("small", p)]
    assert allocate(jobs, 4, now=0.0) == {"big": (0, 0), "small": (4, 64)}


def test_with_room_a_job_grows_to_its_fastest_size_and_batch() -> None:
    p = linear(efficiency=0.9)
    plan = allocate([job("j", p, max_gpus=8)], 64, now=0.0)
    assert plan == {"j": (8, 64)}  # 8 GPUs (two whole nodes), the largest batch


def test_a_running_job_keeps_its_size_unless_the_gain_outweighs_the_resize() -> None:
    p = linear(efficiency=0.02)  # a second GPU adds 2 %: not worth a restart, even a free one
    running = job("j", p, gpus=1, batch=16, changed_at=0.0, max_gpus=2)
    assert allocate([running], 2, now=10_000.0) == {"j": (1, 16)}
    assert allocate([running], 2, now=10_000.0, resize_cost_s=0.0) == {"j": (1, 16)}
    p = linear(efficiency=0.3)  # 30 %: worth it once the job has lasted (it will last again)
    running = job("j", p, gpus=1, batch=16, changed_at=0.0, max_gpus=2)
    assert allocate([running], 2, now=130.0) == {"j": (1, 16)}  # 30 s of 160 s: no gain left
    assert allocate([running], 2, now=10_000.0) == {"j": (2, 32)}
    assert allocate([running], 2, now=130.0, horizon_s=10_000.0) == {"j": (2, 32)}
    # the span ahead is the job's age, not the time since its last resize
    assert allocate([replace(running, changed_at=9_800.0)], 2, now=10_000.0) == {"j": (2, 32)}
    p = linear(efficiency=0.9)  # 90 %: worth it
    running = job("j", p, gpus=1, batch=16, changed_at=0.0, max_gpus=2)
    assert allocate([running], 2, now=10_000.0) == {"j": (2, 32)}
    # a job about to end is not resized: 20 s of work left at 1 GPU
    ending = job("j", p, gpus=1, batch=16, changed_at=0.0, max_gpus=2, remaining=20 * p.throughput(1, 16))
    assert allocate([ending], 2, now=10_000.0) == {"j": (1, 16)}


def test_each_restart_a_job_made_counts_against_the_next() -> None:
    p = linear(efficiency=0.9)  # a second GPU nearly doubles it
    fresh = job("j", p, gpus=1, batch=16, changed_at=0.0, max_gpus=2)
    assert allocate([fresh], 2, now=3_600.0) == {"j": (2, 32)}
    # an hour old with 60 resizes behind it (30 min of restarts): the next is not worth it...
    churned = replace(fresh, restarts=60)
    assert allocate([churned], 2, now=3_600.0) == {"j": (1, 16)}
    # ...until it has run long enough since, or is told a longer span lies ahead
    assert allocate([churned], 2, now=7_200.0) == {"j": (2, 32)}
    assert allocate([churned], 2, now=3_600.0, horizon_s=36_000.0) == {"j": (2, 32)}
    # a shrink it must make (its GPUs are gone) happens whatever its restarts
    big = replace(fresh, gpus=2, batch=32, restarts=1_000)
    assert allocate([big], 1, now=3_600.0) == {"j": (1, 16)}


def test_the_restart_penalty_is_the_share_of_the_span_spent_making_progress() -> None:
    assert restart_penalty(90.0, 0, 30.0) == pytest.approx(0.75)
    assert restart_penalty(3_600.0, 2, 30.0) == pytest.approx(3_540 / 3_630)
    assert restart_penalty(60.0, 2, 30.0) == restart_penalty(0.0, 0, 30.0) == 0.0


def test_no_resize_within_the_minimum_interval_unless_its_gpus_are_gone() -> None:
    p = linear(efficiency=0.9)
    fresh = job("j", p, gpus=1, batch=16, changed_at=100.0, max_gpus=4)
    assert allocate([fresh], 4, now=200.0, min_interval_s=300.0) == {"j": (1, 16)}
    assert allocate([fresh], 4, now=400.0, min_interval_s=300.0) == {"j": (4, 64)}
    # a new job waits for the locked ones rather than shrink them early
    big = job("big", p, gpus=4, batch=64, changed_at=100.0, max_gpus=4)
    plan = allocate([big, job("new", p)], 4, now=200.0, min_interval_s=300.0)
    assert plan == {"big": (4, 64), "new": (0, 0)}
    plan = allocate([big, job("new", p)], 4, now=500.0, min_interval_s=300.0)
    assert plan["new"][0] >= 1 and plan["big"][0] < 4
    # fewer GPUs than a locked job holds (a non-elastic job took them): it shrinks anyway
    assert allocate([big], 2, now=200.0, min_interval_s=300.0)["big"][0] == 2


def test_fixed_batch_changes_only_the_gpu_count_within_what_fits() -> None:
    cifar = named_profile("cifar10")
    fixed = job("j", cifar, min_batch=4096, max_batch=4096, batch=4096, fixed_batch=True, max_gpus=64)
    plan = allocate([fixed], 64, now=0.0)
    assert plan["j"][1] == 4096 and plan["j"][0] >= 4
    assert allocate([fixed], 2, now=0.0) == {"j": (0, 0)}  # 2048 per GPU fits nowhere: it waits
    accumulating = job("j", cifar, batch=4096, fixed_batch=True, max_gpus=64, accumulate=True)
    assert allocate([accumulating], 2, now=0.0) == {"j": (2, 4096)}
    free = job("j", cifar, max_gpus=2)
    assert allocate([free], 2, now=0.0)["j"][1] < 4096  # elastic: a batch that fits 2 GPUs


def test_tenants_caps_hold_and_the_rest_goes_to_others() -> None:
    p = linear(efficiency=0.9)
    jobs = [job("a1", p, tenant="a"), job("a2", p, tenant="a"), job("b1", p, tenant="b")]
    plan = allocate(jobs, 8, now=0.0, tenant_gpus={"a": 2})
    assert plan["a1"][0] + plan["a2"][0] <= 2 and plan["a1"][0] == plan["a2"][0] == 1
    assert plan["b1"][0] == 4  # 1-4 on one node or 8: 5 GPUs left, so 4


def test_the_completion_objective_favours_the_job_nearer_its_end() -> None:
    p = linear(efficiency=0.9)
    near = job("near", p, remaining=1e3)
    far = job("far", p, remaining=1e6)
    plan = allocate([far, near], 5, now=0.0, objective=COMPLETION)
    assert plan["near"][0] == 4 and plan["far"][0] == 1
    with pytest.raises(ValueError):
        allocate([far], 5, now=0.0, objective="fastest")


def test_the_policy_module_imports_no_io() -> None:
    code = (
        "import sys, fleet.scheduler.elastic\n"
        "bad = [m for m in ('redis', 'dramatiq', 'docker', 'fleet.state', 'fleet.bus') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
