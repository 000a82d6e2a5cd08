"""A deterministic DistributedDataParallel job (CPU, gloo) that checkpoints and resumes as a gang.

An MLP learns a fixed random teacher. Step ``i``'s global batch is drawn from a generator seeded
with ``(seed, i)`` and split into equal contiguous shards, one per rank; DDP averages the shards'
gradients, which is the gradient of the whole batch, so any world size trains the same model (up
to float rounding). Rank 0 logs ``step N loss X`` (the global batch's loss after N steps) and
writes the checkpoints; every rank resumes from ``$FLEET_RESUME_FROM``. One member per node::

    torchrun --nnodes $FLEET_NUM_NODES --node-rank $FLEET_NODE_RANK --nproc-per-node 1 \\
        --master-addr $MASTER_ADDR --master-port $MASTER_PORT \\
        workers/examples/train_ddp.py --steps 200 --every 20 --global-batch 32
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel

import fleet_worker as fw


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    parser.add_argument("--global-batch", type=int, default=32, help="split evenly across all ranks")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to make runs killable)")
    parser.add_argument(
        "--dist-timeout",
        type=float,
        default=None,
        help=f"collective timeout, s (default ${fw.dist.TIMEOUT_ENV})",
    )
    return parser.parse_args()


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def shard(
    seed: int, step: int, global_batch: int, teacher: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous slice of step ``step``'s global batch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(global_batch, 16, generator=g)
    size = global_batch // tdist.get_world_size()
    mine = x[tdist.get_rank() * size : (tdist.get_rank() + 1) * size]
    return mine, torch.sin(mine @ teacher)


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def announce() -> None:
    """Every rank says where it is: what the group formed, and the member it belongs to."""
    print(
        f"rank {tdist.get_rank()} of {tdist.get_world_size()} local_rank {fw.dist.local_rank()} "
        f"node {fw.node_rank()} of {fw.num_nodes()} attempt {fw.attempt()} pid {os.getpid()}",
        flush=True,
    )


def resume(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    resumed = fw.dist.load_latest()
    if resumed is None:
        return 0
    state, step = resumed
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"rank {tdist.get_rank()} resumed from step {step} (attempt {fw.attempt()})", flush=True)
    return step


def train(args: argparse.Namespace) -> None:
    announce()
    if args.global_batch % tdist.get_world_size():
        raise SystemExit(
            f"--global-batch {args.global_batch} does not split over {tdist.get_world_size()} ranks"
        )
    teacher = (
        torch.randn(16, 1, generator=torch.Generator().manual_seed(args.seed)) / 4
    )  # sin stays learnable
    model = make_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = resume(model, optimizer)
    ddp = DistributedDataParallel(model)
    stop = fw.stop_requested()
    for step in range(start, args.steps):
        x, y = shard(args.seed, step, args.global_batch, teacher)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        done = step + 1
        tdist.all_reduce(summed := loss.detach().clone())
        global_loss = summed.item() / tdist.get_world_size()
        if fw.dist.is_rank0():
            print(f"step {done} loss {global_loss:.6f}", flush=True)
        stopping = fw.dist.stop_agreed(stop)
        if done % args.every == 0 or done == args.steps or stopping:
            fw.dist.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, done)
            if fw.dist.is_rank0():
                fw.progress(done, total=args.steps, loss=round(global_loss, 6))
        if stopping:
            fw.exit_after_checkpoint()
        time.sleep(args.sleep)
    if fw.dist.is_rank0():
        print(f"final weights {weights_digest(model)}", flush=True)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    with fw.dist.process_group(timeout=args.dist_timeout):
        train(args)


if __name__ == "__main__":
    main()
