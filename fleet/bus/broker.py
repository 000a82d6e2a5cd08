"""dramatiq plumbing: one broker per process, typed sends, workers whose handlers validate payloads.

A handler whose payload fails validation raises :class:`MalformedMessage`; dramatiq's Retries
middleware (``throws``) fails it without retry and the Redis broker moves it to the queue's
dead-letter set (``<queue>.XQ``), where :class:`DeadLetterLog` logs it. dramatiq itself
dead-letters messages for unknown actors. No handler error ever stops a service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, Retries
from pydantic import ValidationError

from fleet.bus.messages import Message
from fleet.config import Settings
from fleet.errors import MalformedMessage
from fleet.log import event
from fleet.state.connection import pool

log = logging.getLogger("fleet.bus")
M = TypeVar("M", bound=Message)
NAMESPACE = "fleet"


class DeadLetterLog(Middleware):
    """Log every message that ends in a dead-letter queue, once, with what was wrong."""

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if exception is not None:
            message.options["fleet_error"] = str(exception).replace("\n", " ")

    def after_nack(self, broker: Any, message: Any) -> None:
        event(
            log, "message_dead_lettered", logging.WARNING,
            queue=message.queue_name, actor=message.actor_name, message_id=message.message_id,
            error=message.options.get("fleet_error", "see previous log line"),
        )  # fmt: skip


class Bus:
    def __init__(self, settings: Settings) -> None:
        self.poll_ms = settings.bus_poll_ms
        self.broker = RedisBroker(  # type: ignore[no-untyped-call]
            client=redis.Redis(connection_pool=pool(settings, settings.bus_db)),
            namespace=NAMESPACE,
            middleware=[Retries(max_retries=0), DeadLetterLog()],
        )

    def send(self, queue: str, message: Message) -> None:
        payload = message.model_dump(exclude={"actor"})
        self.broker.enqueue(
            dramatiq.Message(queue_name=queue, actor_name=message.actor, args=(), kwargs=payload, options={})
        )

    def handle(self, queue: str, schema: type[M], fn: Callable[[M], None]) -> None:
        """Declare an actor on ``queue`` that validates its payload as ``schema`` before calling ``fn``."""

        def actor(*args: Any, **kwargs: Any) -> None:
            try:
                if args:
                    raise ValueError("positional arguments are not accepted")
                msg = schema.model_validate(kwargs)
            except (ValidationError, ValueError) as exc:
                raise MalformedMessage(f"malformed {schema.__name__} on {queue}: {exc}") from None
            fn(msg)

        name = schema.model_fields["actor"].default
        dramatiq.Actor(
            actor, broker=self.broker, actor_name=name, queue_name=queue, priority=0,
            options={"throws": (MalformedMessage,)},
        )  # fmt: skip

    def worker(self, queue: str, threads: int) -> dramatiq.Worker:
        """A started worker consuming only ``queue`` (no delay-queue consumer: fleet never delays)."""
        worker = dramatiq.Worker(
            self.broker, queues={queue}, worker_threads=threads, worker_timeout=self.poll_ms
        )
        worker.start()
        return worker

    def close(self) -> None:
        self.broker.close()
