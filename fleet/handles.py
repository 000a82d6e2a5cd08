"""``fleet.handles``: the job handles' public names (:mod:`fleet.client.handles` is their home)."""

from fleet.client.handles import ALL_COMPLETED, FIRST_COMPLETED, ArrayHandle, JobHandle, as_completed, wait

__all__ = ["ALL_COMPLETED", "FIRST_COMPLETED", "ArrayHandle", "JobHandle", "as_completed", "wait"]
