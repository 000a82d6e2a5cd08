"""An elastic DistributedDataParallel job (gloo on CPU; NCCL on GPUs): resumes at any size.

fleet may restart an elastic job at another GPU count and global batch size (``gpus: {min, max}``,
``batch_size: {min, max}``). Every attempt reads its size: ``FLEET_NUM_GPUS`` workers on each member
(one process per GPU, forked here; several members: ``FLEET_NUM_NODES`` of them, meeting at
``MASTER_ADDR``), ``FLEET_BATCH_SIZE`` samples per step over all of them. It resumes from the
checkpoint at whatever size it now has: the step count, the model and the optimizer's state carry
over; the learning rate is rescaled to the new batch (``fw.scale_lr``: the linear scaling rule, or
``--lr-rule sqrt|adascale``). A change of its batch alone it takes up where it runs, without a
restart: at each checkpoint every worker reads the batch fleet wants now (``fw.dist.batch_agreed``)
and switches to it at the same step (``--no-follow``: only at start, and fleet restarts it instead).

An MLP learns a fixed random teacher; step ``i``'s global batch comes from a generator seeded with
``(seed, i)`` and is split over the workers as evenly as it goes, each worker's loss weighted by its
share, so DDP's average is the gradient of the whole batch at every size. Every worker measures the
gradient noise scale from the gradients it has (``fw.GradientNoiseScale``; it needs two workers or
more); rank 0 logs ``step N loss X (workers W, batch B)``, reports samples/s and the noise scale
(``fw.report``: fleet sizes the job by goodput from them) and writes checkpoints, which keep the
noise scale's estimate for the next size::

    fleet submit --gpus 1-4 --batch-size 128-1024 --profile cifar10 -- \\
        python workers/examples/train_elastic.py --steps 2000 --every 20
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel

import fleet_worker as fw


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=20, help="checkpoint (and report) every N steps")
    parser.add_argument(
        "--batch", type=int, default=256, help="global batch outside fleet (no FLEET_BATCH_SIZE)"
    )
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate at --base-batch")
    parser.add_argument("--base-batch", type=int, default=256, help="the batch --lr was tuned at")
    parser.add_argument("--lr-rule", choices=fw.elastic.RULES, default="linear", help="fw.scale_lr's rule")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to make runs last)")
    parser.add_argument(
        "--no-gns", action="store_true", help="report samples/s only: fleet sizes the job by throughput"
    )
    parser.add_argument(
        "--no-follow",
        action="store_true",
        help="read the batch at start only: fleet restarts the job to change it (else it follows in place)",
    )
    parser.add_argument("--done-file", type=Path, help="end (exit 0) at the next checkpoint once it exists")
    return parser.parse_args()


# -- the launcher: one worker process per GPU of this member ---------------------------------------


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    local = max(fw.num_gpus(), 1)
    nodes, node = fw.num_nodes(), fw.node_rank()
    if nodes == 1:  # one member: its workers meet here (a gang's meet at rank 0's MASTER_ADDR)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if local > 1:  # DDP's constructor imports torch's compiler (torch 2.13: ~1.5 s of CPU): once, here
        importlib.import_module("torch._dynamo")
    fork = multiprocessing.get_context("fork")  # torch is imported once, here, not once per worker
    workers = [
        fork.Process(target=worker, args=(args, node * local + i, local * nodes)) for i in range(local)
    ]
    signal.signal(signal.SIGTERM, lambda *_: _signal(workers, signal.SIGTERM))  # Docker: to PID 1 only
    for w in workers:
        w.start()
    sys.exit(_wait(workers))


def _wait(workers: list[multiprocessing.process.BaseProcess]) -> int:
    """The first failing worker's exit status (0 when all succeed); a worker that fails takes the others
    down at once, rather than leaving them waiting in a collective until its timeout."""
    running, status = list(workers), 0
    while running:
        ended = multiprocessing.connection.wait([w.sentinel for w in running])
        for w in [w for w in running if w.sentinel in ended]:
            running.remove(w)
            w.join()  # its sentinel closes a moment before it can be reaped: exitcode may still be None
            code = w.exitcode or 0
            code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
            if code and not status:
                status = code
                if code != fw.signals.TERMINATED:  # a checkpointing stop ends them all by itself
                    _signal(running, signal.SIGKILL)
    return status


def _signal(workers: list[multiprocessing.process.BaseProcess], sig: int) -> None:
    for w in workers:
        if w.pid is not None and w.exitcode is None:
            os.kill(w.pid, sig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- a worker ------------------------------------------------------------------------------------


def worker(args: argparse.Namespace, rank: int, world: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % max(fw.num_gpus(), 1)))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # stop_requested() installs the real one
    try:
        with fw.dist.process_group():  # gloo; NCCL when this member has GPUs and CUDA works
            train(args)
    except fw.StaleAttempt as stale:
        print(f"rank {rank}: {stale}", flush=True)
        sys.exit(fw.signals.TERMINATED)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batch_of(
    args: argparse.Namespace, step: int, batch: int, teacher: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """This worker's share of step ``step``'s global batch."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(batch, 16, generator=g)
    start, stop = fw.elastic.shard(batch, tdist.get_world_size(), tdist.get_rank())
    return x[start:stop], torch.sin(x[start:stop] @ teacher)


def resume(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    gns: fw.GradientNoiseScale,
    batch: int,
    lr: float,
) -> int:
    resumed = fw.dist.load_latest()
    if resumed is None:
        return 0
    state, step = resumed
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])  # momentum carries over
    if "gns" in state:
        gns.load_state_dict(state["gns"])
    set_lr(optimizer, lr)  # the new batch's
    if fw.dist.is_rank0():
        now = f"{tdist.get_world_size()} workers, batch {batch}, lr {lr:.4g}"
        was = f"{state['workers']} workers, batch {state['batch']}"
        print(f"resumed from step {step} at {now} (was {was}; attempt {fw.attempt()})", flush=True)
    return step


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def train(args: argparse.Namespace) -> None:
    world, batch = tdist.get_world_size(), start_batch(args)
    cuda = tdist.get_backend() == "nccl"
    device = torch.device("cuda", fw.dist.local_rank()) if cuda else torch.device("cpu")
    teacher = torch.randn(16, 1, generator=torch.Generator().manual_seed(args.seed)) / 4
    model = make_model(args.seed).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    gns = fw.GradientNoiseScale(ddp)  # every worker, before the first forward pass
    lr = fw.scale_lr(args.lr, args.base_batch, batch, args.lr_rule, gns)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    start = resume(model, optimizer, gns, batch, lr)
    lr = fw.scale_lr(args.lr, args.base_batch, batch, args.lr_rule, gns)  # the estimate resumed
    set_lr(optimizer, lr)
    if fw.dist.is_rank0() and not start:
        print(f"starting at {world} workers, batch {batch}, lr {lr:.4g}", flush=True)
    stop = fw.stop_requested()
    samples, done = 0, start
    for step in range(start, args.steps):
        x, y = (t.to(device) for t in batch_of(args, step, batch, teacher))
        optimizer.zero_grad()
        # the sum over this share, as a part of the global batch's mean: DDP averages over workers
        loss = torch.nn.functional.mse_loss(ddp(x), y, reduction="sum") * world / batch
        loss.backward()
        gns.step(batch)  # the noise scale from this step's gradients, before the next zero_grad
        optimizer.step()
        done, samples = step + 1, samples + batch
        tdist.all_reduce(summed := loss.detach().clone())
        global_loss = summed.item() / world
        if fw.dist.is_rank0():
            print(f"step {done} loss {global_loss:.6f} (workers {world}, batch {batch})", flush=True)
        finished = done == args.steps or agreed(bool(args.done_file and args.done_file.exists()))
        stopping = fw.dist.stop_agreed(stop)
        if done % args.every == 0 or finished or stopping:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "workers": world,
                "batch": batch,
                "gns": gns.state_dict(),
            }
            fw.dist.save(state, done)
            if fw.dist.is_rank0():
                noise = None if args.no_gns else gns
                fw.report(samples=samples, step=done, gns=noise, batch_size=batch, loss=round(global_loss, 6))
            samples = 0
            if not (finished or stopping):
                batch = follow(args, batch, done, optimizer, gns)
        if stopping:
            fw.exit_after_checkpoint()
        if finished:
            break
        time.sleep(args.sleep)
    if fw.dist.is_rank0():
        print(f"finished at step {done}", flush=True)


def start_batch(args: argparse.Namespace) -> int:
    """The batch it starts at: its launch's, or (following) fleet's now, which may have changed since."""
    batch = fw.batch_size(args.batch) or args.batch
    return batch if args.no_follow else fw.dist.batch_agreed(batch)


def follow(
    args: argparse.Namespace,
    batch: int,
    done: int,
    optimizer: torch.optim.Optimizer,
    gns: fw.GradientNoiseScale,
) -> int:
    """The batch to go on at (fleet's now, the same on every worker, unless ``--no-follow``), with
    the learning rate set for it (AdaScale's each time: its gain follows the noise scale)."""
    new = batch if args.no_follow else fw.dist.batch_agreed(batch)
    if new != batch and fw.dist.is_rank0():
        print(f"batch {batch} -> {new} in place at step {done}", flush=True)
    if args.lr_rule == "adascale" or new != batch:
        set_lr(optimizer, fw.scale_lr(args.lr, args.base_batch, new, args.lr_rule, gns))
    return new


def agreed(value: bool) -> bool:
    """True on every worker when it is True on any (each sees the file at its own moment)."""
    flag = threading.Event()
    if value:
        flag.set()
    return fw.dist.stop_agreed(flag)


if __name__ == "__main__":
    main()
