"""An in-memory bus for tests and simulations, as dramatiq's ``StubBroker`` is for dramatiq.

``StubBus`` has the methods the controller and the agent call on :class:`fleet.bus.Bus` (``send``,
``handle``, ``worker``, ``delete_queue``, ``close``), and nothing is delivered until the caller says
so: :meth:`StubBus.deliver` hands each queued message to its handler, in the caller's thread. A
message is a payload as the real bus carries it: encoded on ``send`` and validated against the
handler's schema on delivery, so a message that would not survive the real bus does not survive
this one either. Nothing is sent through Redis: it tests what is done with messages, not the bus.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, TypeVar

from fleet.bus.messages import Message

M = TypeVar("M", bound=Message)


class _Idle:
    """What ``worker`` returns: messages are delivered by ``StubBus.deliver``, not by threads."""

    def stop(self, timeout: int = 0) -> None:
        """Nothing runs."""


class StubBus:
    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[str, dict[str, Any]]]] = defaultdict(deque)
        self._handlers: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {}
        #: (queue, message) of everything sent, in order: what the test may look back on
        self.sent: list[tuple[str, Message]] = []

    def send(self, queue: str, message: Message) -> None:
        self.sent.append((queue, message))
        self.queues[queue].append((message.actor, message.model_dump(mode="json", exclude={"actor"})))

    def handle(self, queue: str, schema: type[M], fn: Callable[[M], None]) -> None:
        name = schema.model_fields["actor"].default
        self._handlers[(queue, name)] = lambda payload: fn(schema.model_validate(payload))

    def worker(self, queue: str, threads: int) -> _Idle:
        return _Idle()

    def delete_queue(self, queue: str) -> int:
        return 1 if self.queues.pop(queue, None) else 0

    def close(self) -> None:
        """Nothing to release."""

    def pending(self, queue: str | None = None) -> int:
        """Messages queued and not delivered yet (on ``queue``, or on every queue)."""
        return len(self.queues.get(queue, ())) if queue is not None else sum(map(len, self.queues.values()))

    def deliver(self, queue: str | None = None) -> int:
        """Hand every message queued (on ``queue``, or on every queue), and every message those send
        in turn, to its handler; how many were delivered. A message no handler takes stays queued,
        as on a queue no one consumes yet; a handler's exception reaches the caller."""
        delivered = 0
        while ready := [
            q
            for q, held in self.queues.items()
            if held and queue in (None, q) and (q, held[0][0]) in self._handlers
        ]:
            for name in ready:
                actor, payload = self.queues[name].popleft()
                self._handlers[(name, actor)](payload)
                delivered += 1
        return delivered
