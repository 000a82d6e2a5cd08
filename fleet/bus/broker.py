"""dramatiq plumbing: one broker per process, typed sends, workers whose handlers validate payloads.

A handler whose payload fails validation raises :class:`MalformedMessage`; dramatiq's Retries
middleware (``throws``) fails it without retry and the Redis broker moves it to the queue's
dead-letter set (``<queue>.XQ``), where :class:`DeadLetterLog` logs it. dramatiq itself
dead-letters messages for unknown actors; :class:`_Consumer` dead-letters bytes that are not a
dramatiq message at all. No handler error ever stops a service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import ConnectionClosed, DecodeError
from dramatiq.middleware import Middleware, Retries
from dramatiq.worker import _WorkerMiddleware
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
    """Log every message that ends in a dead-letter queue, once, with what was wrong, and keep only
    the newest ``keep`` dead letters of that queue (dramatiq expires them by age only, and only
    when someone dispatches on the queue)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if exception is not None:
            message.options["fleet_error"] = str(exception).replace("\n", " ")

    def after_nack(self, broker: Any, message: Any) -> None:
        event(
            log, "message_dead_lettered", logging.WARNING,
            queue=message.queue_name, actor=message.actor_name, message_id=message.message_id,
            redis_message_id=message.options.get("redis_message_id"),
            error=message.options.get("fleet_error", "see previous log line"),
        )  # fmt: skip
        trim_dead_letters(broker, message.queue_name, self.keep)


class _Consumer(_RedisConsumer):
    """dramatiq's Redis consumer, except that bytes it cannot decode are dead-lettered, not fatal.

    dramatiq decodes inside ``__next__`` (brokers/redis.py ``Message.decode(data)``): a decode
    error escapes to the ConsumerThread, which drops the consumer with its prefetched messages
    and restarts it 3 s later, leaving the bad bytes and the rest of the batch fetched but never
    acked, to be redelivered (and crash again) once this process is gone.
    """

    def __next__(self) -> MessageProxy | None:
        while True:
            try:
                proxy: MessageProxy | None = super().__next__()  # type: ignore[no-untyped-call]
                return proxy
            except DecodeError as exc:
                self._dead_letter(exc)

    def _dead_letter(self, exc: DecodeError) -> None:
        try:
            message_id = self._fetched_id(exc.data)
            if message_id is not None:
                self.broker.do_nack(self.queue_name, message_id)  # dispatch.lua: acks -> XQ, atomically
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        event(
            log, "message_dead_lettered", logging.WARNING,
            queue=self.queue_name, redis_message_id=message_id, error=undecodable(exc),
        )  # fmt: skip
        for middleware in self.broker.middleware:
            if isinstance(middleware, DeadLetterLog):
                trim_dead_letters(self.broker, self.queue_name, middleware.keep)

    def _fetched_id(self, data: bytes) -> str | None:
        """The Redis id of a fetched, unacked message holding ``data`` (dramatiq's fetch returns
        only the data). The unacked set holds at most ``prefetch`` ids, so this is cheap."""
        unacked, messages = dramatiq_keys(self.broker, self.queue_name)
        ids = sorted(self.broker.client.smembers(unacked))
        found = self.broker.client.hmget(messages, ids) if ids else []
        return next((i.decode() for i, d in zip(ids, found, strict=True) if d == data), None)


def dramatiq_keys(broker: RedisBroker, queue: str) -> tuple[str, str]:
    """dramatiq's keys (brokers/redis/dispatch.lua) for the set of ids this broker fetched from
    ``queue`` and has not acked, and the hash of message id -> data still on ``queue``."""
    return f"{broker.namespace}:__acks__.{broker.broker_id}.{queue}", f"{broker.namespace}:{queue}.msgs"


def queue_keys(broker: RedisBroker, queue: str) -> list[str]:
    """dramatiq's keys of ``queue`` (brokers/redis/dispatch.lua): pending ids, id -> data, and the
    same two for its dead letters."""
    name = f"{broker.namespace}:{queue}"
    return [name, f"{name}.msgs", f"{name}.XQ", f"{name}.XQ.msgs"]


#: keep the newest ARGV[1] dead letters: KEYS[1] the queue's dead-letter zset (id -> when),
#: KEYS[2] its hash of id -> data; returns how many went
_TRIM = """
local old = redis.call('ZRANGE', KEYS[1], 0, -tonumber(ARGV[1]) - 1)
for i = 1, #old, 500 do
  local chunk = {unpack(old, i, math.min(i + 499, #old))}
  redis.call('ZREM', KEYS[1], unpack(chunk))
  redis.call('HDEL', KEYS[2], unpack(chunk))
end
return #old
"""


def trim_dead_letters(broker: RedisBroker, queue: str, keep: int) -> int:
    """Drop all but the newest ``keep`` dead letters of ``queue`` (one script: both keys at once)."""
    _name, _msgs, dead, dead_msgs = queue_keys(broker, queue)
    return int(broker.client.eval(_TRIM, 2, dead, dead_msgs, keep))


def undecodable(exc: DecodeError) -> str:
    cause = getattr(exc.error, "error", exc.error)  # dramatiq's JSON encoder wraps its error once more
    return f"not a dramatiq message ({type(cause).__name__}: {cause}): {exc.data[:80]!r}".replace("\n", " ")


class _Broker(RedisBroker):
    """dramatiq's Redis broker with fleet's consumer and no delay queues.

    fleet never delays a message (Retries is at ``max_retries=0``), but dramatiq declares a
    ``<queue>.DQ`` for every queue and its Worker starts a consumer polling each one.
    """

    @property
    def consumer_class(self) -> type[_Consumer]:
        return _Consumer

    def declare_queue(self, queue_name: str) -> None:
        # RedisBroker.declare_queue without its delay-queue half (delay_queues, declare_delay_queue)
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None) -> dramatiq.Message[Any]:
        if delay is not None:
            raise ValueError(f"no delay queue on {message.queue_name}: a delayed message would never run")
        sent: dramatiq.Message[Any] = super().enqueue(message)
        return sent


class _Worker(dramatiq.Worker):
    """A dramatiq Worker that leaves the broker as it found it once stopped.

    ``Worker.start`` adds a middleware that starts consumers for queues declared later and
    ``stop`` never takes it off: a controller that gains leadership N times would keep N - 1
    stopped workers on its broker (each new one logging dramatiq's same-middleware warning
    once per old one), ready to start consumers for any queue declared afterwards.
    """

    def stop(self, timeout: int = 600_000) -> None:
        # first, so that no queue declared while stopping gets a consumer; rebound, not removed in
        # place, because another thread may be iterating the list in emit_*
        self.broker.middleware = [m for m in self.broker.middleware if not self._started(m)]
        super().stop(timeout)

    def _started(self, middleware: Middleware) -> bool:
        return isinstance(middleware, _WorkerMiddleware) and middleware.worker is self


class Bus:
    def __init__(self, settings: Settings) -> None:
        self.poll_ms = settings.bus_poll_ms
        self.broker = _Broker(  # type: ignore[no-untyped-call]
            client=redis.Redis(connection_pool=pool(settings, settings.bus_db)),
            namespace=NAMESPACE,
            middleware=[Retries(max_retries=0), DeadLetterLog(settings.bus_dead_letters_max)],
            dead_message_ttl=int(settings.bus_dead_message_ttl_s * 1000),
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
        worker = _Worker(self.broker, queues={queue}, worker_threads=threads, worker_timeout=self.poll_ms)
        worker.start()
        return worker

    def delete_queue(self, queue: str) -> int:
        """Delete every key of ``queue``: its messages, dead letters and any broker's set of fetched,
        unacked ids (a dead agent's, which dramatiq requeues only when someone sends to the queue).
        For the queue of a removed node; the number of keys deleted."""
        client, acks = self.broker.client, f"{self.broker.namespace}:__acks__."
        keys = queue_keys(self.broker, queue)
        for key in client.scan_iter(match=f"{acks}*", count=1000):
            # "<namespace>:__acks__.<broker id>.<queue>"; broker ids are uuids, without dots
            if key.decode().removeprefix(acks).partition(".")[2] == queue:
                keys.append(key.decode())
        return int(client.delete(*keys))

    def close(self) -> None:
        self.broker.close()
