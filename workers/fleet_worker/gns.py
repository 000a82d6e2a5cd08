"""The gradient noise scale of a training job, estimated from the gradients each step already has.

The noise scale ``B_noise = tr(Sigma) / |G|^2`` (McCandlish et al., "An Empirical Model of
Large-Batch Training", 2018) is the batch size around which a larger batch stops paying: well below
it, doubling the batch nearly halves the steps to a given loss; well above it, it barely helps.
fleet's elastic policy weighs a job's samples/s by it (goodput, as Pollux does), so a job that
reports it gets a batch that fits how far its training is; one that does not is kept near the batch
it was tuned at.

How it is estimated: within one optimizer step, ``n`` micro-batch gradients ``g_k`` (one per worker,
times micro-batches under gradient accumulation), each over ``M / n`` of the step's ``M`` samples,
are averaged into the step's gradient ``g``. With ``S = mean |g_k|^2`` and ``T = |g|^2``, unbiased
estimates are ``|G|^2 = (n T - S) / (n - 1)`` and ``tr(Sigma) = (S - T) M / (n - 1)``. Each step's are
noisy (often negative), so each is smoothed by an exponential moving average (bias-corrected, as
Adam's moments are) and the noise scale is the ratio of the two averages. It needs at least two
micro-batch gradients per step: two workers, or gradient accumulation on one; a single worker with
no accumulation learns nothing (its estimate is kept, as a checkpoint carries it).

:class:`NoiseScale` is the arithmetic (pure Python); :class:`GradientNoiseScale` measures ``S`` and
``T`` in a torch job (DistributedDataParallel or not)::

    gns = fw.GradientNoiseScale(model)          # the module DDP wraps, or the DDP itself
    for step in ...:
        for micro in range(accum):               # under ddp.no_sync() for all but the last
            loss_of(micro).backward()
        gns.step(batch)                          # after the step's backward passes, before zero_grad
        optimizer.step(); optimizer.zero_grad()
        if step % 100 == 0:
            fw.report(samples=..., gns=gns)      # rank 0: the noise scale goes with samples/s
"""

from __future__ import annotations

import math
from typing import Any

#: default smoothing per optimizer step (the average's memory: about 1 / (1 - smoothing) steps)
SMOOTHING = 0.995
#: steps measured on the accelerator before their numbers are read back (one host sync per this many)
FOLD_EVERY = 32


class NoiseScale:
    """Smoothed estimates of ``|G|^2`` and ``tr(Sigma)`` from per-step gradient square norms."""

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing: a number in [0, 1) (got {smoothing!r})")
        self.smoothing = smoothing
        self._sqr = self._var = self._weight = 0.0
        self.steps = 0

    def update(self, local_sqr: float, total_sqr: float, count: int, batch: int) -> None:
        """Fold in one optimizer step: ``local_sqr`` the mean square norm of its ``count`` micro-batch
        gradients, ``total_sqr`` the square norm of their mean, ``batch`` its samples (all of them).
        A step of one micro-batch, or with a norm that is not finite (a skipped mixed-precision
        step), changes nothing."""
        if count < 2 or batch < 1 or not (math.isfinite(local_sqr) and math.isfinite(total_sqr)):
            return
        sqr = (count * total_sqr - local_sqr) / (count - 1)
        var = (local_sqr - total_sqr) * batch / (count - 1)
        theta = self.smoothing
        self._sqr = theta * self._sqr + (1 - theta) * sqr
        self._var = theta * self._var + (1 - theta) * var
        self._weight = theta * self._weight + (1 - theta)
        self.steps += 1

    @property
    def sqr(self) -> float | None:
        """The true gradient's square norm ``|G|^2``, None before any step."""
        return self._sqr / self._weight if self._weight else None

    @property
    def var(self) -> float | None:
        """The per-sample gradient covariance's trace ``tr(Sigma)``, None before any step."""
        return self._var / self._weight if self._weight else None

    @property
    def noise_scale(self) -> float | None:
        """``tr(Sigma) / |G|^2`` in samples, or None while unknown (no step yet, or the estimates not
        yet positive: the gradient is still all noise as far as the steps so far can tell)."""
        sqr, var = self.sqr, self.var
        if sqr is None or var is None or sqr <= 0 or var <= 0:
            return None
        return var / sqr

    def state_dict(self) -> dict[str, float]:
        """What a checkpoint keeps, so a resized attempt goes on from the estimate so far."""
        return {"sqr": self._sqr, "var": self._var, "weight": self._weight, "steps": float(self.steps)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._sqr, self._var = float(state["sqr"]), float(state["var"])
        self._weight, self.steps = float(state["weight"]), int(state["steps"])


class GradientNoiseScale(NoiseScale):
    """The noise scale of a torch model's training, from its gradients (see the module's text).

    Each parameter's gradient from each backward pass (one micro-batch's, before DDP averages it
    over the workers) adds its square norm on the device; :meth:`step` adds the averaged gradient's,
    and, with several workers, averages the per-worker sums in one all-reduce of two numbers,
    started asynchronously. Numbers are read back to the host every ``FOLD_EVERY`` steps or when
    :attr:`noise_scale` is read. Every worker must call :meth:`step` at every optimizer step (the
    all-reduce is collective); reading the estimate is local (rank 0 reports it)."""

    def __init__(self, model: Any, smoothing: float = SMOOTHING, replicas: int | None = None) -> None:
        import torch.distributed as tdist

        super().__init__(smoothing)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("model: no parameters that require gradients")
        distributed = tdist.is_available() and tdist.is_initialized()
        self.replicas = replicas or (tdist.get_world_size() if distributed else 1)
        self._norms: list[Any] = []
        self._calls = [0] * len(self._params)
        self._pending: list[tuple[Any, Any, int, int]] = []  # (all-reduce, stats, count, batch)
        self._hooks = [p.register_hook(self._hook(i)) for i, p in enumerate(self._params)]

    def _hook(self, index: int) -> Any:
        import torch

        def hook(grad: Any) -> None:
            self._norms.append(torch.linalg.vector_norm(grad.detach(), dtype=torch.float32))
            self._calls[index] += 1

        return hook

    def step(self, batch: int) -> None:
        """Measure this optimizer step: call it after its backward passes (all micro-batches'),
        before the gradients are zeroed. ``batch``: the step's samples over all workers."""
        import torch
        import torch.distributed as tdist

        micro = max(self._calls)
        if not micro:
            return
        local = torch.stack(self._norms).square().sum() / micro  # this worker's mean over micro-batches
        self._norms, self._calls = [], [0] * len(self._params)
        grads = [p.grad.detach() for p in self._params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0).to(local.device).square() / micro**2
        stats = torch.stack([local, total.to(local.dtype)])
        work = None
        if self.replicas > 1:
            stats /= self.replicas
            work = tdist.all_reduce(stats, async_op=True)
        self._pending.append((work, stats, self.replicas * micro, batch))
        if len(self._pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        import torch

        if not self._pending:
            return
        for work, _, _, _ in self._pending:
            if work is not None:
                work.wait()
        values = torch.stack([stats for _, stats, _, _ in self._pending]).cpu().tolist()
        for (_, _, count, batch), (local, total) in zip(self._pending, values, strict=True):
            self.update(local, total, count, batch)
        self._pending = []

    @property
    def sqr(self) -> float | None:
        self._fold()
        return super().sqr

    @property
    def var(self) -> float | None:
        self._fold()
        return super().var

    def state_dict(self) -> dict[str, float]:
        self._fold()
        return super().state_dict()

    def remove(self) -> None:
        """Take the gradient hooks off the model."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
