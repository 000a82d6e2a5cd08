"""The HTTP API (``fleet api``): tokens, roles and tenants in front of the fleet's operations."""

from __future__ import annotations

from pathlib import Path

from fleet.config import Settings

GRACE_S = 3


def serve(
    settings: Settings, host: str, port: int, *, cert: Path | None = None, key: Path | None = None
) -> None:
    """Serve until SIGTERM or SIGINT: HTTPS when given a certificate and its key, else HTTP. A stop
    gives calls in progress (a wait, a followed log) ``GRACE_S`` to end: their clients call again."""
    import uvicorn

    from fleet.api.app import create_app

    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        ssl_certfile=cert,
        ssl_keyfile=key,
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=GRACE_S,
    )
