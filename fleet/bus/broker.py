"""dramatiq plumbing: one broker per process, typed sends, workers whose handlers validate payloads.

A handler whose payload fails validation raises :class:`MalformedMessage`; dramatiq's Retries
middleware (``throws``) fails it without retry and the Redis broker moves it to the queue's
dead-letter set (``<queue>.XQ``), where :class:`~fleet.bus.deadletters.DeadLetterLog` logs it.
dramatiq itself dead-letters messages for unknown actors; :class:`_Consumer` dead-letters bytes
that are not a dramatiq message at all. No handler error ever stops a service.

Consumers block instead of polling: see :mod:`fleet.bus.wake`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import MAINTENANCE_COMMAND_BLACKLIST, RedisBroker, _RedisConsumer, _scripts
from dramatiq.errors import ConnectionClosed, DecodeError
from dramatiq.middleware import Middleware, Retries
from dramatiq.worker import ConsumerThread, _WorkerMiddleware
from pydantic import ValidationError

from fleet.bus import wake
from fleet.bus.deadletters import DeadLetterLog, dramatiq_keys, queue_keys, trim_dead_letters, undecodable
from fleet.bus.messages import Message
from fleet.config import Settings
from fleet.errors import MalformedMessage
from fleet.log import event
from fleet.state.connection import pool

log = logging.getLogger("fleet.bus")
M = TypeVar("M", bound=Message)
NAMESPACE = "fleet"
#: how often idle worker threads look up from dramatiq's in-process work queue (no Redis I/O): a
#: stopped worker ends within this
WORKER_TIMEOUT_MS = 100
#: dramatiq's queue maintenance runs with one dispatch call per this many seconds, per process
MAINTENANCE_INTERVAL_S = 15.0


class _Consumer(_RedisConsumer):
    """dramatiq's Redis consumer, except that it blocks while idle and dead-letters undecodable bytes.

    Idle, dramatiq's consumer sleeps a few ms and fetches again; this one waits on its queue's wake
    list (:mod:`fleet.bus.wake`), or, while its prefetch is full, for an ack. Fetching, acks, nacks,
    requeues and heartbeats (each dispatch call) stay dramatiq's.

    Bytes that are not a dramatiq message: dramatiq decodes inside ``__next__`` (brokers/redis.py
    ``Message.decode(data)``), and a decode error escapes to the ConsumerThread, which drops the
    consumer with its prefetched messages and restarts it 3 s later, leaving the bad bytes and the
    rest of the batch fetched but never acked, to be redelivered (and crash again) once this
    process is gone.
    """

    broker: _Broker

    def __init__(self, broker: _Broker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        self._settled = threading.Event()  # a message was acked or nacked: room to prefetch again
        keys = [broker.stop_list(queue_name), wake.wake_list(broker.namespace, queue_name)]
        self._waiter = wake.Waiter(broker.blocking_client, keys, broker.poll_s)

    def __next__(self) -> MessageProxy | None:
        while True:
            try:
                if not self.message_cache and not self._refill():
                    return None  # dramatiq's ConsumerThread checks whether it is stopping, and asks again
                proxy: MessageProxy | None = super().__next__()  # type: ignore[no-untyped-call]
                return proxy
            except DecodeError as exc:
                self._dead_letter(exc)

    def _refill(self) -> bool:
        """Fetch what the prefetch has room for; when nothing came, wait for a reason to look again:
        a wake token, a stop token, an ack making room, or ``bus_poll_ms`` (the safety net that also
        finds messages requeued by dramatiq's maintenance, and keeps the heartbeat going)."""
        self._settled.clear()
        room = self.prefetch - self.outstanding_message_count
        try:
            if room <= 0:
                self._settled.wait(self.broker.poll_s)
                return False
            self.message_cache = self.broker.do_fetch(self.queue_name, room)
            if not self.message_cache:
                self._waiter.wait()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        return bool(self.message_cache)

    def ack(self, message: MessageProxy) -> None:
        try:
            super().ack(message)  # type: ignore[no-untyped-call]
        finally:
            self._settled.set()

    def nack(self, message: MessageProxy) -> None:
        try:
            super().nack(message)  # type: ignore[no-untyped-call]
        finally:
            self._settled.set()

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """dramatiq's requeue (a stopping worker's prefetched messages), then a wake-up for whichever
        consumer of the queue runs next."""
        messages = list(messages)
        super().requeue(messages)  # type: ignore[no-untyped-call]
        if messages:
            self.broker.notify(self.queue_name)

    def interrupt(self) -> None:
        """Stop waiting for an ack (the stop token ends a blocking wait)."""
        self._settled.set()

    def close(self) -> None:
        self._waiter.close()

    def _dead_letter(self, exc: DecodeError) -> None:
        try:
            message_id = self._fetched_id(exc.data)
            if message_id is not None:
                self.broker.do_nack(self.queue_name, message_id)  # dispatch.lua: acks -> XQ, atomically
        except redis.ConnectionError as e:
            raise ConnectionClosed(e) from None  # type: ignore[no-untyped-call]
        event(
            log,
            "message_dead_lettered",
            logging.WARNING,
            queue=self.queue_name,
            redis_message_id=message_id,
            error=undecodable(exc),
        )
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


_KEYS_CALL = 'local ack_queues = redis.call("keys", dead_worker_acks .. "*")'
_SCAN_LOOP = """local ack_queues, cursor = {}, "0"
        repeat
            local page = redis.call("scan", cursor, "match", dead_worker_acks .. "*", "count", 1000)
            cursor, ack_queues = page[1], page[2]
        until cursor == "0" or next(ack_queues)"""


@functools.cache
def dispatch_script() -> str:
    """dramatiq's dispatch.lua with its one KEYS call replaced by a SCAN loop, same answer.

    Its maintenance asks whether a dead broker still holds fetched messages of any queue
    (``KEYS <namespace>:__acks__.<broker id>*``). KEYS is in Redis' ``@dangerous`` category: a
    user allowed it may block Redis listing every key of any DB. With SCAN the services' ACL users
    (config/users.acl) need no KEYS; the scan walks only the bus DB, which holds a few keys per queue.
    """
    script = _scripts["dispatch"]  # dramatiq reads its scripts as bytes
    text = script.decode() if isinstance(script, bytes) else script
    if text.count(_KEYS_CALL) != 1:  # a dramatiq upgrade changed the script: look again, do not guess
        raise RuntimeError("dramatiq's dispatch.lua no longer has the one KEYS call fleet replaces")
    return text.replace(_KEYS_CALL, _SCAN_LOOP)


class _Broker(RedisBroker):
    """dramatiq's Redis broker with fleet's consumer, wake-ups after each enqueue, no delay queues.

    fleet never delays a message (Retries is at ``max_retries=0``), but dramatiq declares a
    ``<queue>.DQ`` for every queue and its Worker starts a consumer polling each one.
    """

    def __init__(
        self, *, poll_ms: int, blocking_client: Callable[[float], redis.Redis], **options: Any
    ) -> None:
        super().__init__(**options)  # type: ignore[no-untyped-call]
        self.scripts["dispatch"] = self.client.register_script(dispatch_script())
        self.poll_s = poll_ms / 1000
        #: a client on a connection of its own, with this socket timeout (s), for a consumer's BLPOP
        self.blocking_client = blocking_client
        self._next_maintenance = 0.0

    def _should_do_maintenance(self, command: str) -> int:
        """Whether this dispatch call also runs dramatiq's maintenance (dispatch.lua: the unacked
        messages of a process whose heartbeat is older than ``heartbeat_timeout`` go back to their
        queue; expired dead letters go). dramatiq draws it for 0.1% of calls: every ~15 s for a
        consumer polling 67 times a second, but every ~30 min for one that blocks, so a message a
        dead process held would wait that long. fleet runs it on a clock instead."""
        now = time.monotonic()
        if command in MAINTENANCE_COMMAND_BLACKLIST or now < self._next_maintenance:
            return 0
        self._next_maintenance = now + MAINTENANCE_INTERVAL_S
        return 1

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
        self.notify(message.queue_name)  # after the enqueue: a consumer woken before it could miss it
        return sent

    def notify(self, queue: str) -> None:
        """Wake one idle consumer of ``queue``. Best effort: without it, the message waits for a
        consumer's next safety-net fetch (``bus_poll_ms``)."""
        try:
            wake.push(self.client, wake.wake_list(self.namespace, queue))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            event(log, "bus_wake_failed", logging.WARNING, queue=queue, error=str(exc))

    def stop_list(self, queue: str) -> str:
        return wake.stop_list(self.namespace, self.broker_id, queue)

    def interrupt(self, queue: str) -> None:
        """End this process's consumer of ``queue``'s blocking wait (it is stopping)."""
        # without Redis the consumer's own connection fails too, or its block ends by itself
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            wake.push(self.client, self.stop_list(queue))


class _ConsumerThread(ConsumerThread):
    """dramatiq's consumer thread, whose stop also ends its consumer's blocking wait.

    The stop token goes to a list only this process's consumer of the queue reads, so it works
    whichever consumer object the thread holds right now (one restarted after a connection error).
    """

    broker: _Broker

    def stop(self) -> None:
        super().stop()
        if isinstance(self.consumer, _Consumer):
            self.consumer.interrupt()
        self.broker.interrupt(self.queue_name)


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

    def _add_consumer(self, queue_name: str, *, delay: bool = False) -> None:
        # Worker._add_consumer with fleet's consumer thread; fleet declares no delay queues
        whitelist = self.consumer_whitelist
        if queue_name in self.consumers or (whitelist and queue_name not in whitelist):
            return
        thread = self.consumers[queue_name] = _ConsumerThread(
            broker=self.broker,
            queue_name=queue_name,
            prefetch=self.queue_prefetch,
            work_queue=self.work_queue,
            worker_timeout=self.worker_timeout,
        )
        thread.start()


class Bus:
    def __init__(self, settings: Settings) -> None:
        def blocking_client(socket_timeout: float) -> redis.Redis:
            conn = pool(settings, settings.bus_db, socket_timeout=socket_timeout, max_connections=1)
            return redis.Redis(connection_pool=conn)

        self.broker = _Broker(
            poll_ms=settings.bus_poll_ms,
            blocking_client=blocking_client,
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
            actor,
            broker=self.broker,
            actor_name=name,
            queue_name=queue,
            priority=0,
            options={"throws": (MalformedMessage,)},
        )

    def worker(self, queue: str, threads: int) -> dramatiq.Worker:
        """A started worker consuming only ``queue`` (no delay-queue consumer: fleet never delays)."""
        worker = _Worker(
            self.broker, queues={queue}, worker_threads=threads, worker_timeout=WORKER_TIMEOUT_MS
        )
        worker.start()
        return worker

    def delete_queue(self, queue: str) -> int:
        """Delete every key of ``queue``: its messages, dead letters, wake and stop lists and any
        broker's set of fetched, unacked ids (a dead agent's, which dramatiq requeues only when
        someone sends to the queue).
        For the queue of a removed node; the number of keys deleted."""
        client = self.broker.client
        keys = [*queue_keys(self.broker, queue), wake.wake_list(self.broker.namespace, queue)]
        for prefix in (f"{self.broker.namespace}:__acks__.", f"{self.broker.namespace}:__stop__."):
            for key in client.scan_iter(match=f"{prefix}*", count=1000):
                # "<namespace>:__acks__|__stop__.<broker id>.<queue>"; broker ids are uuids, no dots
                if key.decode().removeprefix(prefix).partition(".")[2] == queue:
                    keys.append(key.decode())
        return int(client.delete(*keys))

    def close(self) -> None:
        self.broker.close()
