"""What the API does, on Redis: the fleet's reads (:class:`fleet.api.queries.Queries`) and writes
(:class:`fleet.api.commands.Commands`, and a user's control of jobs:
:class:`fleet.api.jobctl.JobCommands`) on a Redis of its own, opened from the settings.

The API server calls it for every request (after checking the caller's token and tenant);
services, benchmarks and tests of the state layer call it directly. Users never hold Redis
credentials: they use :class:`fleet.client.Client`, which talks HTTP to the API.
"""

from __future__ import annotations

from pathlib import Path

from fleet.api.jobctl import JobCommands
from fleet.config import Settings, load_settings
from fleet.state import Stores


class Backend(JobCommands):
    """The fleet's operations on its Redis (``FLEET_REDIS_URL``, or ``config``/``redis_url``)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        config: str | Path | None = None,
        settings: Settings | None = None,
        connections: int | None = None,
        background_hints: bool = False,
    ) -> None:
        """``connections``: at most that many Redis connections, a call beyond waiting for one.
        ``background_hints``: the controller is told of new jobs by a thread of this backend's,
        not by the submit (the API: a submit answers once its job is stored)."""
        settings = settings or load_settings(config, redis_url=redis_url)
        stores = Stores.open(settings, most=connections)
        super().__init__(settings, stores, background_hints=background_hints)

    def close(self) -> None:
        self._hints.close()
        self.stores.close()
        if self._bus is not None:
            self._bus.close()
