"""Multi-node (torchrun) jobs: ranks, a process group that fails fast, rank-0 checkpoints.

fleet starts one member per node with ``FLEET_NUM_NODES``, ``FLEET_NODE_RANK``, ``FLEET_NUM_GPUS``
and torch's ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK``; torchrun then sets
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` for each worker it starts. A plain one-process-per-node
launch has no ``RANK``: its rank is the member's ``FLEET_NODE_RANK``. The rank functions need no
torch; the rest imports it when called::

    with fw.dist.process_group():                  # gloo, or nccl when this member has GPUs
        resumed = fw.dist.load_latest()            # the same checkpoint on every rank (checked)
        stop = fw.stop_requested()
        for step in range(start, total):
            ...
            stopping = fw.dist.stop_agreed(stop)   # a SIGTERM on any rank stops all at this step
            if step % 100 == 0 or stopping:
                fw.dist.save(state, step)          # rank 0 writes; every rank waits until it has
            if stopping:
                fw.exit_after_checkpoint()
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from fleet_worker import checkpoint
from fleet_worker.checkpoint import StaleAttempt
from fleet_worker.env import node_rank, num_gpus, num_nodes

#: seconds a collective may wait for a peer before the group fails (a peer on a frozen or
#: unreachable node sends no reset); it also bounds how long rank 0 may take to write a checkpoint
TIMEOUT_ENV = "FLEET_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
_PR_SET_PDEATHSIG = 1


class CheckpointFailed(RuntimeError):
    """A checkpoint the ranks share could not be written, or the ranks loaded different ones."""


def rank() -> int:
    return int(os.environ.get("RANK", node_rank()))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", num_nodes()))


def is_rank0() -> bool:
    return rank() == 0


def timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def default_backend() -> str:
    import torch

    return "nccl" if num_gpus() > 0 and torch.cuda.is_available() else "gloo"


def init(backend: str | None = None, timeout: float | None = None) -> None:
    """Join the job's process group (``env://``: ``MASTER_ADDR``/``MASTER_PORT``) as ``rank()``.

    ``timeout`` (seconds) defaults to ``$FLEET_DIST_TIMEOUT_S``, else 600; torch's own default
    (30 minutes for gloo) would keep a gang waiting that long for a member on a frozen node.
    """
    import torch
    import torch.distributed as tdist

    _die_with_launcher()
    chosen = backend or default_backend()
    if chosen == "nccl":
        torch.cuda.set_device(local_rank())
    wait = timedelta(seconds=timeout if timeout is not None else timeout_s())
    tdist.init_process_group(chosen, init_method="env://", rank=rank(), world_size=world_size(), timeout=wait)


@contextmanager
def process_group(backend: str | None = None, timeout: float | None = None) -> Iterator[None]:
    """``init`` for the ``with`` block. Leaving it normally or by ``sys.exit`` (as
    ``exit_after_checkpoint`` does on every rank at once) waits for every rank (a barrier) and
    destroys the group; an exception leaves the group as it is, since a peer may be gone.

    Create the DDP model inside the block, in a function it calls, so it is gone when the group is.
    """
    init(backend, timeout)
    try:
        yield
    except SystemExit as leaving:
        _release_frames(leaving)
        _leave()
        raise
    else:
        _leave()


def _release_frames(leaving: SystemExit) -> None:
    """Free the job's locals (its DDP model) that the exit's traceback would keep until the
    interpreter finalizes: DDP's reducer would then destroy the group, joining gloo's worker threads
    with the GIL held while one of them waits for the GIL to free a collective's tensors (a hang at
    exit, about one run in six). Freed now, the group dies in ``destroy_process_group``, which lets go
    of the GIL first."""
    traceback.clear_frames(leaving.__traceback__)
    gc.collect()  # DDP's own reference cycles


def _leave() -> None:
    import torch.distributed as tdist

    tdist.barrier()  # a rank that closed its connections early would fail a peer still receiving
    tdist.destroy_process_group()


def stop_agreed(stop: threading.Event) -> bool:
    """True on every rank once ``stop`` is set on any rank (one one-element all-reduce).

    Each member gets its SIGTERM at its own moment; deciding together makes every rank checkpoint
    at the same step and leave, instead of one leaving while the others wait in a collective.
    """
    if not _initialized():
        return stop.is_set()
    import torch
    import torch.distributed as tdist

    flag = torch.tensor([int(stop.is_set())], device=_device())
    tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
    return bool(flag.item())


def batch_agreed(current: int) -> int:
    """The global batch every rank runs at from now on: what fleet wants now, as rank 0 reads it
    (``fw.batch_size(current, follow=True)``), the same on every rank (one one-element broadcast).

    Call it every few steps (where the job reports, say); when it returns another batch than
    ``current``, every rank switches at the same step: take its share (``fw.elastic.shard``) and
    rescale the learning rate. Calling it tells fleet the job follows a batch change in place.
    """
    from fleet_worker.env import batch_size

    if not _initialized():
        return batch_size(current, follow=True) or current
    import torch
    import torch.distributed as tdist

    found = (batch_size(current, follow=True) or current) if is_rank0() else current
    value = torch.tensor([found], dtype=torch.int64, device=_device())
    tdist.broadcast(value, src=0)
    return int(value.item())


def save(state: Any, step: int, keep: int = 2) -> Path:
    """Rank 0 saves ``state`` (see ``fleet_worker.save``); every rank returns once it is written.

    The others' ``state`` is ignored. Whatever rank 0 meets (``StaleAttempt``, a full disk) is
    raised on every rank, so none runs ahead of a checkpoint or waits for one that never comes.
    """
    if not _initialized():
        return checkpoint.save(state, step, keep)
    import torch.distributed as tdist

    error: Exception | None = None
    outcome: list[Any] = [None]
    if is_rank0():
        try:
            outcome = [("ok", str(checkpoint.save(state, step, keep)))]
        except Exception as e:  # every rank must hear of it, not wait for the timeout
            error, outcome = e, [(type(e).__name__, str(e))]
    tdist.broadcast_object_list(outcome, src=0)
    kind, text = outcome[0]
    if error is not None:
        raise error
    if kind == StaleAttempt.__name__:
        raise StaleAttempt(text)
    if kind != "ok":
        raise CheckpointFailed(f"rank 0 could not checkpoint step {step}: {kind}: {text}")
    return Path(text)


def load_latest() -> tuple[Any, int] | None:
    """``fleet_worker.load_latest()`` on every rank, checked to be the same step on all of them.

    Every rank reads ``$FLEET_RESUME_FROM`` (else the ``latest`` marker) itself; ranks that resumed
    from different checkpoints would train on apart without any error, so that raises here.
    """
    loaded = checkpoint.load_latest()
    if _initialized():
        import torch.distributed as tdist

        steps: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(steps, None if loaded is None else loaded[1])
        if len(set(steps)) > 1:
            raise CheckpointFailed(f"ranks would resume from different steps: {steps}")
    return loaded


def _initialized() -> bool:
    if "torch" not in sys.modules:
        return False  # no group without torch, and checking must not import it
    import torch.distributed as tdist

    return tdist.is_available() and tdist.is_initialized()


def _device() -> Any:
    import torch
    import torch.distributed as tdist

    return torch.device("cuda", torch.cuda.current_device()) if tdist.get_backend() == "nccl" else "cpu"


def _die_with_launcher() -> None:
    """SIGKILL this worker when torchrun dies.

    torchrun starts each worker in a session of its own, so a SIGKILL of the member's process group
    (a fence, a stop past its grace period) kills torchrun and leaves the worker training on as an
    orphan, holding its GPUs and its peers. Linux only; a no-op outside torchrun.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
