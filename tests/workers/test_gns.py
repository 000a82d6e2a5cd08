"""The gradient noise scale a job estimates from its own gradients, on a problem whose noise scale is
known: linear regression, ``y = x . w* + eps`` with ``x ~ N(0, I_d)`` and ``eps ~ N(0, s^2)``. At
weights ``w = w* + delta`` the per-sample gradient of ``(x . w - y)^2 / 2`` has mean ``G = delta`` and
covariance ``(|delta|^2 + s^2) I + delta delta^T``, so ``B_noise = d (1 + s^2 / |delta|^2) + 1``."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fleet_worker as fw
from fleet_worker import signals
from tests.conftest import need_torch

D, NOISE, DELTA = 8, 1.5, 1.0
TRUE_SCALE = D * (1 + NOISE**2 / DELTA**2) + 1  # 27


def regression(rng: np.random.Generator, samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``samples`` draws of x and y, and the weights (w* + delta) the gradients are taken at."""
    truth = np.ones(D)
    delta = np.zeros(D)
    delta[0] = DELTA
    x = rng.standard_normal((samples, D))
    return x, x @ truth + NOISE * rng.standard_normal(samples), truth + delta


def test_the_noise_scale_of_a_known_problem_is_recovered_from_per_step_norms() -> None:
    rng = np.random.default_rng(3)
    estimate = fw.NoiseScale(smoothing=0.998)
    for _ in range(3000):
        workers, per = 4, 16  # 4 micro-batch gradients of 16 samples each, one step of 64
        x, y, w = regression(rng, workers * per)
        per_sample = x * (x @ w - y)[:, None]
        micro = per_sample.reshape(workers, per, D).mean(axis=1)
        local = float((micro**2).sum(axis=1).mean())
        total = float((micro.mean(axis=0) ** 2).sum())
        estimate.update(local, per, total, workers * per)
    assert estimate.sqr == pytest.approx(DELTA**2, rel=0.15)
    assert estimate.noise_scale == pytest.approx(TRUE_SCALE, rel=0.15)


def test_one_gradient_per_step_teaches_nothing_and_the_estimate_survives_a_checkpoint() -> None:
    estimate = fw.NoiseScale()
    estimate.update(2.0, 64, 2.0, 64)  # no smaller batch to compare
    estimate.update(float("nan"), 16, 1.0, 64)
    assert (estimate.noise_scale, estimate.steps) == (None, 0)
    estimate.update(3.0, 32, 1.0, 64)  # |G|^2 = (64 - 96) / 32 < 0: all noise so far
    assert estimate.noise_scale is None
    estimate.update(3.0, 32, 2.5, 64)
    again = fw.NoiseScale()
    again.load_state_dict(json.loads(json.dumps(estimate.state_dict())))
    assert again.noise_scale == estimate.noise_scale and again.steps == 2


def test_a_torch_model_estimates_its_noise_scale_from_accumulated_micro_batches() -> None:
    need_torch()
    import torch

    rng = np.random.default_rng(5)
    model = torch.nn.Linear(D, 1, bias=False)
    _, _, w = regression(rng, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(w, dtype=torch.float32)[None, :])
    gns = fw.GradientNoiseScale(model, smoothing=0.998)
    accum, per = 4, 16
    for _ in range(1500):  # the weights stay put: every step sees the same true noise scale
        x, y, _ = regression(rng, accum * per)
        xs, ys = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
        model.zero_grad()
        for k in range(accum):
            part = slice(k * per, (k + 1) * per)
            loss = ((model(xs[part]).squeeze(1) - ys[part]) ** 2).mean() / 2 / accum
            loss.backward()
        gns.step(accum * per)
    assert gns.noise_scale == pytest.approx(TRUE_SCALE, rel=0.2)
    gns.remove()


def ddp_worker(rank: int, store: str, out: Any) -> None:
    """One of two gloo workers: DDP over the regression's shards, the estimate sent back by rank 0."""
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    rng = np.random.default_rng(11 + rank)
    model = torch.nn.Linear(D, 1, bias=False)
    _, _, w = regression(rng, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(w, dtype=torch.float32)[None, :])
    ddp = DistributedDataParallel(model)
    gns = fw.GradientNoiseScale(ddp, smoothing=0.998)
    for _ in range(1500):  # 2 workers x 32 samples a step; the weights stay put
        x, y, _ = regression(rng, 32)
        xs, ys = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
        model.zero_grad()
        (((ddp(xs).squeeze(1) - ys) ** 2).mean() / 2).backward()
        gns.step(64)
    state = gns.state_dict()  # every worker, as at a checkpoint: the collectives in flight end
    if rank == 0:
        out.put((gns.noise_scale, int(state["steps"])))
    tdist.destroy_process_group()


def test_two_ddp_workers_on_gloo_estimate_the_noise_scale_from_their_all_reduce(tmp_path: Path) -> None:
    need_torch()
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    workers = [fork.Process(target=ddp_worker, args=(r, str(tmp_path / "store"), out)) for r in (0, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=100)
    assert [w.exitcode for w in workers] == [0, 0]
    found, steps = out.get(timeout=5)
    assert steps == 1500 and found == pytest.approx(TRUE_SCALE, rel=0.2)


def test_one_worker_without_accumulation_reports_no_noise_scale(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    need_torch()
    import torch

    model = torch.nn.Linear(D, 1)
    gns = fw.GradientNoiseScale(model)
    for _ in range(5):
        model.zero_grad()
        model(torch.randn(16, D)).pow(2).mean().backward()
        gns.step(16)
    assert gns.noise_scale is None
    monkeypatch.setattr(signals, "_reported", signals._Throughput())
    fw.report(samples=80, gns=gns, batch_size=16)
    fields = json.loads(capsys.readouterr().out.strip().split(" ", 1)[1])
    assert "gns" not in fields and fields["batch_size"] == 16


def test_report_carries_the_noise_scale_and_the_batch_in_use(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEET_BATCH_SIZE", "512")
    monkeypatch.setattr(signals, "_reported", signals._Throughput())
    fw.report(samples=100, step=3, gns=1234.56789)
    fields = json.loads(capsys.readouterr().out.strip().split(" ", 1)[1])
    assert (fields["gns"], fields["batch_size"]) == (1234.57, 512)


def test_adascale_lies_between_no_scaling_and_linear_and_follows_the_noise_scale() -> None:
    # far below the noise scale a sample counts fully (near linear); far above, barely (near 1)
    assert fw.scale_lr(0.1, 256, 1024, rule="adascale", noise_scale=1e9) == pytest.approx(0.4, rel=1e-6)
    assert fw.scale_lr(0.1, 256, 1024, rule="adascale", noise_scale=0.0) == pytest.approx(0.1)
    middle = fw.scale_lr(0.1, 256, 1024, rule="adascale", noise_scale=1024)
    assert middle == pytest.approx(0.1 * (1024 + 256) * 1024 / (2048 * 256))
    assert fw.scale_lr(0.1, 256, 1024, rule="adascale") == pytest.approx(0.1)  # no estimate yet
    estimate = fw.NoiseScale(smoothing=0.0)
    estimate.update(3.0, 32, 2.5, 64)  # |G|^2 = 2, tr(Sigma) = 0.5 x 64: B = 16
    assert estimate.noise_scale == pytest.approx(16.0)
    adascale = fw.scale_lr(0.1, 32, 64, rule="adascale", noise_scale=estimate)
    assert adascale == pytest.approx(0.1 * (16 + 32) * 64 / ((16 + 64) * 32))
    with pytest.raises(ValueError, match="noise_scale"):
        fw.scale_lr(0.1, 256, 1024, rule="adascale", noise_scale=-1.0)
