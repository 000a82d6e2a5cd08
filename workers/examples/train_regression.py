"""A small deterministic torch job that checkpoints and resumes bit-for-bit.

An MLP learns a fixed random teacher on synthetic data. Batch ``i`` is drawn from a generator
seeded with ``(seed, i)``, so data needs no loader state; model, optimizer and RNG states are
checkpointed. CPU, one thread, deterministic algorithms: a run killed at any step and resumed ends
with the same weights as one that was never interrupted.

    FLEET_CHECKPOINT_DIR=/tmp/ck python3 train_regression.py --steps 300 --every 25
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

import torch

import fleet_worker as fw


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(seed: int, step: int, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(32, 16, generator=g)
    return x, torch.sin(x @ teacher)


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="checkpoint every N steps")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to make runs killable)")
    parser.add_argument(
        "--fail-at", type=int, default=-1, help="exit 1 at this step on attempt 1 (crash test)"
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    teacher = torch.randn(16, 1, generator=torch.Generator().manual_seed(args.seed))
    model, optimizer = model_and_optimizer(args.seed)
    random.seed(args.seed)
    start = 0
    resumed = fw.load_latest()
    if resumed is not None:
        state, step = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        start = step
        print(f"resumed from step {step} (attempt {fw.attempt()})", flush=True)
    stop = fw.stop_requested()
    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        if step == args.fail_at and fw.attempt() == 1:
            print(f"crashing at step {step} on purpose", flush=True)
            raise SystemExit(1)
        x, y = batch(args.seed, step, teacher)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        done = step + 1
        if done % args.every == 0 or stop.is_set():
            fw.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "python_rng": random.getstate(),
                },
                done,
            )
            fw.progress(done, total=args.steps, loss=round(loss.item(), 6))
        if stop.is_set():
            fw.exit_after_checkpoint()
        time.sleep(args.sleep)
    print(f"final loss {loss.item():.6f} weights {weights_digest(model)}", flush=True)


if __name__ == "__main__":
    main()
