"""The Python client of the fleet API, one module per concern, none importing a module above it:

- :mod:`~fleet.client.credentials`: where the API is and the token (``fleet login``'s file, the environment)
- :mod:`~fleet.client.endpoints`: every API call declared once (method, path, body, answer)
- :mod:`~fleet.client.transport`: HTTP on kept-alive connections; the API's errors raised as themselves
- :mod:`~fleet.client.handles`: :class:`JobHandle`, :class:`ArrayHandle`, :func:`wait`, :func:`as_completed`
- :mod:`~fleet.client.workdir`: packing a directory to ship with a job
- :mod:`~fleet.client.sync`: :class:`Client`; :mod:`~fleet.client.aio`: :class:`AsyncClient`

``from fleet.client import Client, JobHandle, wait`` works as it always has.
"""

from __future__ import annotations

from fleet.client.credentials import credentials_path, save_credentials
from fleet.client.handles import ALL_COMPLETED, FIRST_COMPLETED, ArrayHandle, JobHandle, as_completed, wait
from fleet.client.sync import Client
from fleet.client.transport import CONNECT_RETRIES

__all__ = [
    "ALL_COMPLETED",
    "CONNECT_RETRIES",
    "FIRST_COMPLETED",
    "ArrayHandle",
    "Client",
    "JobHandle",
    "as_completed",
    "credentials_path",
    "save_credentials",
    "wait",
]
