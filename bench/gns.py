"""What measuring the gradient noise scale costs a training step (``fw.GradientNoiseScale``).

Times optimizer steps of torchvision models on one GPU (CUDA events, after warm-up), each step two
micro-batches of gradient accumulation under DistributedDataParallel (one process: the estimator's
communication hook and first-micro-batch norm run as they do on many GPUs, less the all-reduce of
two numbers), with and without the estimator, alternating blocks of steps so drift hits both
alike; prints the step times, the overhead and the estimate::

    python3 -m bench.gns [--models resnet18,resnet50] [--batch 64] [--steps 32] [--rounds 5]

Needs torch, torchvision and a CUDA device (CPU timings say nothing about a GPU job's step). The
estimator's work done the same way (its hooks and norms, inline) cost on an H100 (torch 2.11)
+0.5 % of a step for resnet50 at 64 x 2 and +0.6-0.8 % for resnet18 at 64 x 2; where the step
waits on Python (resnet50 at 16 x 2) the blocks varied more than the difference.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import fleet_worker as fw


def step_time(ddp: Any, optimizer: Any, data: Any, gns: Any, steps: int, accum: int) -> float:
    """Mean milliseconds of ``steps`` optimizer steps of ``accum`` micro-batches each."""
    import contextlib

    import torch

    x, y = data
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        for micro in range(accum):
            with ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext():
                torch.nn.functional.cross_entropy(ddp(x), y).div(accum).backward()
        if gns is not None:
            gns.step(x.shape[0] * accum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / steps


def setup(name: str, batch: int) -> tuple[Any, Any, Any]:
    """(the DDP model, its optimizer, a batch) of a fresh torchvision model."""
    import torch
    import torchvision
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=100).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    return DistributedDataParallel(model), optimizer, (x, torch.randint(0, 100, (batch,), device="cuda"))


def measure(name: str, batch: int, steps: int, rounds: int, accum: int = 2) -> dict[str, Any]:
    plain_ddp, plain_opt, data = setup(name, batch)
    ddp, optimizer, _ = setup(name, batch)
    gns = fw.GradientNoiseScale(ddp)  # its communication hook: before the first forward pass
    step_time(plain_ddp, plain_opt, data, None, 5, accum)  # warm-up: cuDNN's choices, the allocator
    step_time(ddp, optimizer, data, gns, 5, accum)
    plain, measured = [], []
    for _ in range(rounds):
        plain.append(step_time(plain_ddp, plain_opt, data, None, steps, accum))
        measured.append(step_time(ddp, optimizer, data, gns, steps, accum))
    base, with_gns = statistics.median(plain), statistics.median(measured)
    return {
        "model": name,
        "batch": f"{batch} x {accum}",
        "params": sum(1 for p in ddp.parameters() if p.requires_grad),
        "step_ms": base,
        "with_gns_ms": with_gns,
        "overhead_pct": 100 * (with_gns - base) / base,
        "gns": gns.noise_scale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--batch", type=int, default=64, help="samples per micro-batch")
    parser.add_argument("--steps", type=int, default=32, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=5, help="blocks of each kind (medians are shown)")
    args = parser.parse_args()
    import torch
    import torch.distributed as tdist

    tdist.init_process_group("nccl", init_method="tcp://127.0.0.1:29511", rank=0, world_size=1)
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
