"""``fleet.aio``: the asyncio client's public names (:mod:`fleet.client.aio` is their home)."""

from fleet.client.aio import AsyncArrayHandle, AsyncClient, AsyncJobHandle, as_completed, wait
from fleet.client.aio_functions import AsyncFunctionHandle
from fleet.client.functions import AsyncFunction
from fleet.client.handles import ALL_COMPLETED, FIRST_COMPLETED

__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "AsyncArrayHandle",
    "AsyncClient",
    "AsyncFunction",
    "AsyncFunctionHandle",
    "AsyncJobHandle",
    "as_completed",
    "wait",
]
