"""The API's guard, which checks a call's token before its body is read."""

from __future__ import annotations

import json
from typing import Any

import anyio

from fleet.api.guard import Guard
from fleet.errors import StoreUnavailable


class _RedisDown:
    def identify(self, token: str) -> None:
        raise StoreUnavailable(
            "redis unavailable: Error 111 connecting to 127.0.0.1:6379. Connection refused."
        )


def test_a_call_with_a_body_while_redis_is_down_is_told_to_retry_not_a_server_error() -> None:
    # Given Redis down (a restart, a failover) when a submit arrives
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the route ran without a checked token")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    guard = Guard(app, _RedisDown(), 1 << 20, 1 << 20)  # type: ignore[arg-type]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/jobs",
        "headers": [(b"authorization", b"Bearer fleet_x"), (b"content-length", b"2")],
    }
    # When the guard cannot look up its token
    anyio.run(guard, scope, receive, send)
    # Then the client is answered 503 (its CLI exits 5 and retries), saying Redis is unavailable
    assert sent[0]["status"] == 503
    assert "redis unavailable" in json.dumps(json.loads(sent[1]["body"]))
