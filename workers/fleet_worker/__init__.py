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
"""

from fleet_worker import dist
from fleet_worker.checkpoint import StaleAttempt, checkpoint_dir, latest_name, load_latest, save
from fleet_worker.env import attempt, job_id, node_rank, num_gpus, num_nodes
from fleet_worker.signals import exit_after_checkpoint, progress, stop_requested

__all__ = [
    "StaleAttempt", "attempt", "checkpoint_dir", "dist", "exit_after_checkpoint", "job_id",
    "latest_name", "load_latest", "node_rank", "num_gpus", "num_nodes", "progress", "save",
    "stop_requested",
]  # fmt: skip
