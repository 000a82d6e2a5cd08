"""The in-container SDK: checkpoints that survive crashes, prompt SIGTERM handling, progress.

Pure Python; torch is optional (used for tensors when present). Inside a fleet job::

    import fleet_worker as fw

    state = fw.load_latest()            # None on a fresh start; honours FLEET_RESUME_FROM
    stop = fw.stop_requested()           # a SIGTERM handler that only sets a flag
    for step in range(start, total):
        ...
        if step % 100 == 0 or stop.is_set():
            fw.save({"model": model.state_dict(), ...}, step)
        if stop.is_set():
            fw.exit_after_checkpoint()

Multi-node (torchrun) jobs use ``fw.dist`` for ranks, the process group and rank-0 checkpoints.
Elastic jobs read their size at every start (``fw.num_gpus()``, ``fw.batch_size()``), rescale their
learning rate (``fw.scale_lr``) and report throughput (``fw.report(samples=...)``): see ``fw.elastic``.
They may report their gradient noise scale with it (``fw.GradientNoiseScale``, ``fw.report(gns=...)``),
so fleet sizes them by goodput: see ``fw.gns``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet_worker import checkpoint, dist, elastic, env, gns, signals
    from fleet_worker.checkpoint import StaleAttempt, checkpoint_dir, latest_name, load_latest, save
    from fleet_worker.elastic import scale_lr
    from fleet_worker.env import attempt, batch_size, job_id, node_rank, num_gpus, num_nodes
    from fleet_worker.gns import GradientNoiseScale, NoiseScale
    from fleet_worker.signals import exit_after_checkpoint, progress, report, stop_requested

#: the module of each public name but the modules themselves, imported at the name's first use: a
#: job starts with only what it uses (a function's runner, ``python -m fleet_worker.call``, none)
_HOME = {
    **dict.fromkeys(("StaleAttempt", "checkpoint_dir", "latest_name", "load_latest", "save"), "checkpoint"),
    "scale_lr": "elastic",
    **dict.fromkeys(("attempt", "batch_size", "job_id", "node_rank", "num_gpus", "num_nodes"), "env"),
    **dict.fromkeys(("GradientNoiseScale", "NoiseScale"), "gns"),
    **dict.fromkeys(("exit_after_checkpoint", "progress", "report", "stop_requested"), "signals"),
}
_MODULES = ("checkpoint", "dist", "elastic", "env", "gns", "signals")


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"fleet_worker.{name}")  # the import sets it here too
    if name not in _HOME:
        raise AttributeError(f"module 'fleet_worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fleet_worker.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "GradientNoiseScale",
    "NoiseScale",
    "StaleAttempt",
    "attempt",
    "batch_size",
    "checkpoint_dir",
    "dist",
    "elastic",
    "exit_after_checkpoint",
    "gns",
    "job_id",
    "latest_name",
    "load_latest",
    "node_rank",
    "num_gpus",
    "num_nodes",
    "progress",
    "report",
    "save",
    "scale_lr",
    "stop_requested",
]
