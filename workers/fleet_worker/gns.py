"""The gradient noise scale of a training job, estimated from the gradients each step already has.

The noise scale ``B_noise = tr(Sigma) / |G|^2`` (McCandlish et al., "An Empirical Model of
Large-Batch Training", 2018) is the batch size around which a larger batch stops paying: well below
it, doubling the batch nearly halves the steps to a given loss; well above it, it barely helps.
fleet's elastic policy weighs a job's samples/s by it (goodput, as Pollux does), so a job that
reports it gets a batch that fits how far its training is; one that does not is kept near the batch
it was tuned at.

How it is estimated (McCandlish et al.'s appendix A): a gradient over ``b`` samples has expected
square norm ``|G|^2 + tr(Sigma) / b``. Two of them over ``b_small < b_big`` samples, with square norms
``S`` and ``T``, give unbiased estimates ``|G|^2 = (b_big T - b_small S) / (b_big - b_small)`` and
``tr(Sigma) = (S - T) / (1 / b_small - 1 / b_big)``. A training step has such a pair for free:
each worker's own gradient before DistributedDataParallel averages them (``S``, the workers' mean,
over ``M / workers`` samples each) and the averaged one (``T``, over the step's ``M``); with gradient
accumulation on one worker, the first micro-batch's gradient and the step's. Each step's estimates
are noisy (often negative), so each is smoothed by an exponential moving average (bias-corrected,
as Adam's moments are) and the noise scale is the ratio of the two averages. One worker with no
accumulation has no pair and learns nothing (its estimate is kept, as a checkpoint carries it).

:class:`NoiseScale` is the arithmetic (pure Python); :class:`GradientNoiseScale` measures the norms in
a torch job, DistributedDataParallel or a single process::

    ddp = DistributedDataParallel(model)
    gns = fw.GradientNoiseScale(ddp)             # every worker, before the first forward pass
    for step in ...:
        for micro in range(accum):               # under ddp.no_sync() for all but the last
            loss_of(micro).backward()
        gns.step(batch)                          # after the step's backward passes, before zero_grad
        optimizer.step(); optimizer.zero_grad()
        if step % 100 == 0:
            fw.report(samples=..., gns=gns)      # rank 0: the noise scale goes with samples/s

What it costs a step: with DDP, a norm of each gradient bucket as DDP hands it to its all-reduce
(a DDP communication hook doing what the default one does after that); with accumulation, one
fused norm of all gradients after the first micro-batch; at :meth:`~GradientNoiseScale.step`, one
fused norm of the averaged gradients and, with several workers, an asynchronous all-reduce of two
numbers. Numbers stay on the device and are read back once every ``FOLD_EVERY`` steps.
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

    def update(self, small_sqr: float, small_batch: float, big_sqr: float, big_batch: float) -> None:
        """Fold in one step's pair: ``small_sqr`` the square norm of a gradient over ``small_batch``
        samples (or the mean of several such), ``big_sqr`` that of one over ``big_batch``. A pair
        with ``small_batch >= big_batch``, or a norm that is not finite (a skipped mixed-precision
        step), changes nothing."""
        if not 0 < small_batch < big_batch or not (math.isfinite(small_sqr) and math.isfinite(big_sqr)):
            return
        sqr = (big_batch * big_sqr - small_batch * small_sqr) / (big_batch - small_batch)
        var = (small_sqr - big_sqr) / (1 / small_batch - 1 / big_batch)
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

    ``model``: the DistributedDataParallel model when there are several workers (a communication
    hook is registered on it: create this before its first forward pass), else the model. Every
    worker calls :meth:`step` at every optimizer step (with several workers it starts a collective);
    reading the estimate is local (rank 0 reports it)."""

    def __init__(self, model: Any, smoothing: float = SMOOTHING) -> None:
        import torch.distributed as tdist
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(smoothing)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("model: no parameters that require gradients")
        self._ddp = model if isinstance(model, DistributedDataParallel) else None
        distributed = tdist.is_available() and tdist.is_initialized()
        if self._ddp is not None:
            self.replicas = tdist.get_world_size(self._ddp.process_group)
            self._ddp.register_comm_hook(self._ddp.process_group, self._comm_hook)
        elif distributed and tdist.get_world_size() > 1:
            raise ValueError(
                "model: with several workers, pass the DistributedDataParallel model (its gradients "
                "before and after the all-reduce are what is measured)"
            )
        else:
            self.replicas = 1
        self._buckets: list[Any] = []  # this step's bucket norms, before the all-reduce
        self._first: Any = None  # the square norm after the step's first backward pass
        self._micro = 0  # backward passes since the last step()
        self._queued = False
        self._pending: list[tuple[Any, Any, float, float]] = []  # (all-reduce, [small, big], batches)
        # the end of each backward pass: a callback queued by the first of the last few parameters'
        # gradients (those of the output layer, computed first), not a hook on every parameter
        self._hooks = [p.register_hook(self._on_grad) for p in self._params[-3:]]

    def _comm_hook(self, group, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self._buckets.append(torch.linalg.vector_norm(bucket.buffer(), dtype=torch.float32))
        return allreduce_hook(group, bucket)

    def _on_grad(self, grad: Any) -> None:
        if not self._queued:
            from torch.autograd import Variable

            self._queued = True
            Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._queued = False
        self._micro += 1
        syncing = self._ddp is not None and self._ddp.require_backward_grad_sync
        if self._micro == 1 and not syncing and self.replicas == 1:
            self._first = self._square_norm()  # the first micro-batch's gradient, alone so far

    def _square_norm(self) -> Any:
        import torch

        grads = [p.grad.detach() for p in self._params if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0).float().square()

    def step(self, batch: int) -> None:
        """Measure this optimizer step: call it after its backward passes (all micro-batches'),
        before the gradients are zeroed. ``batch``: the step's samples over all workers."""
        import torch
        import torch.distributed as tdist

        micro, buckets, first = max(self._micro, 1), self._buckets, self._first
        self._micro, self._buckets, self._first = 0, [], None
        if self.replicas > 1 and buckets:  # each worker's gradient against the average
            small: Any = torch.stack(buckets).square().sum() / micro**2 / self.replicas
            pair = (batch / self.replicas, float(batch))
        elif micro > 1 and first is not None:  # the first micro-batch's against the step's
            small, pair = first, (batch / micro, float(batch))
        else:
            return
        big = self._square_norm().to(small.device) / micro**2
        stats = torch.stack([small, big / self.replicas if self.replicas > 1 else big])
        work = (
            tdist.all_reduce(stats, group=self._ddp.process_group, async_op=True)
            if self.replicas > 1
            else None
        )
        if self._pending and self._pending[-1][0] is not None:  # the last step's: long done
            self._pending[-1][0].wait()
            self._pending[-1] = (None, *self._pending[-1][1:])
        self._pending.append((work, stats, *pair))
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
        for (_, _, small_batch, big_batch), (small, big) in zip(self._pending, values, strict=True):
            self.update(small, small_batch, big, big_batch)
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
        """Take the gradient hooks off the model (a DDP communication hook stays: DDP keeps it)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
