"""What measuring the gradient noise scale costs a training step (``fw.GradientNoiseScale``).

Times optimizer steps of torchvision models on one GPU (CUDA events, after warm-up), each step two
micro-batches of gradient accumulation (so the estimator has two gradients to compare, as two DDP
workers would give it), with and without the estimator, alternating blocks of steps so drift hits
both alike; prints the step times, the overhead and the estimate::

    python3 -m bench.gns [--models resnet18,resnet50] [--batch 64] [--steps 40] [--rounds 5]

Needs torch, torchvision and a CUDA device (CPU timings say nothing about a GPU job's step).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import fleet_worker as fw


def step_time(model: Any, optimizer: Any, data: Any, gns: Any, steps: int, accum: int) -> float:
    """Mean milliseconds of ``steps`` optimizer steps of ``accum`` micro-batches each."""
    import torch

    x, y = data
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        for _ in range(accum):
            torch.nn.functional.cross_entropy(model(x), y).div(accum).backward()
        if gns is not None:
            gns.step(x.shape[0] * accum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / steps


def measure(name: str, batch: int, steps: int, rounds: int, accum: int = 2) -> dict[str, Any]:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=100).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    data = (x, torch.randint(0, 100, (batch,), device="cuda"))
    gns = fw.GradientNoiseScale(model)
    gns.remove()  # hooks on only while timed with them
    step_time(model, optimizer, data, None, 5, accum)  # warm-up: cuDNN's choices, the allocator
    plain, measured = [], []
    for _ in range(rounds):
        plain.append(step_time(model, optimizer, data, None, steps, accum))
        gns = fw.GradientNoiseScale(model)
        measured.append(step_time(model, optimizer, data, gns, steps, accum))
        estimate = gns.noise_scale
        gns.remove()
    base, with_gns = statistics.median(plain), statistics.median(measured)
    return {
        "model": name,
        "batch": f"{batch} x {accum}",
        "params": sum(1 for p in model.parameters() if p.requires_grad),
        "step_ms": base,
        "with_gns_ms": with_gns,
        "overhead_pct": 100 * (with_gns - base) / base,
        "gns": estimate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--batch", type=int, default=64, help="samples per micro-batch")
    parser.add_argument("--steps", type=int, default=40, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=5, help="blocks of each kind (medians are shown)")
    args = parser.parse_args()
    import torch

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    head = ("model", "batch", "params", "step ms", "+gns ms", "overhead", "gns")
    print("{:<10} {:>8} {:>6} {:>8} {:>8} {:>9} {:>10}".format(*head))
    for name in args.models.split(","):
        r = measure(name, args.batch, args.steps, args.rounds)
        gns = "-" if r["gns"] is None else f"{r['gns']:.4g}"
        print(
            f"{r['model']:<10} {r['batch']:>8} {r['params']:>6} {r['step_ms']:>8.2f} "
            f"{r['with_gns_ms']:>8.2f} {r['overhead_pct']:>8.2f}% {gns:>10}",
            flush=True,
        )


if __name__ == "__main__":
    main()
