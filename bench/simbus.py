"""Consuming many node queues from one process, for the node simulator (``bench/nodesim.py``).

Two ways, both on fleet's own broker (``fleet.bus.Bus``) and dramatiq's own fetch/ack script, so
the controller sees exactly what it sees from real agents:

- ``DramatiqConsumer``: one dramatiq ``Worker`` with ``queues={every node queue}``. dramatiq runs
  one consumer thread per queue, each polling its queue with its own backoff: N polls per
  ``bus_poll_ms`` for N nodes, whether or not anything is queued.
- ``SharedConsumer``: one thread asks Redis which node queues hold messages (one script call per
  round, an ``LLEN`` per queue inside Redis), then fetches only from those through dramatiq's
  ``fetch`` and acks through its ``ack``, exactly as dramatiq's consumer does.

Both call ``handler(queue, message)`` with the decoded dramatiq message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from fleet.bus import Bus
from fleet.bus.broker import WORKER_TIMEOUT_MS
from fleet.log import event

log = logging.getLogger("bench.simbus")
Handler = Callable[[str, dramatiq.Message[Any]], None]

#: KEYS[i] dramatiq's list of pending message ids of queue i (``<namespace>:<queue>``).
#: Returns the 1-based indexes of the lists that are not empty. Reads dramatiq's keys, never writes.
NONEMPTY_LUA = """
local found = {}
for i, key in ipairs(KEYS) do
  if redis.call('LLEN', key) > 0 then found[#found + 1] = i end
end
return found
"""


class SharedConsumer:
    """One polling thread for every queue; handlers run on ``pool``, each message acked after."""

    def __init__(
        self,
        bus: Bus,
        queues: list[str],
        handler: Handler,
        pool: ThreadPoolExecutor,
        prefetch: int = 64,
        poll_s: float = 0.02,
    ) -> None:
        self.broker, self.queues, self.handler, self.pool = bus.broker, queues, handler, pool
        self.poll_s, self.prefetch = poll_s, prefetch
        self._keys = [f"{self.broker.namespace}:{q}" for q in queues]
        self._nonempty = self.broker.client.register_script(NONEMPTY_LUA)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shared-consumer", daemon=True)
        self.rounds = 0
        self.messages = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._round()
            except Exception as exc:  # Redis away: try again next round, as dramatiq's consumer does
                event(log, "consumer_round_failed", logging.WARNING, error=exc)
            self._stop.wait(max(self.poll_s - (time.monotonic() - started), 0.0))

    def _round(self) -> None:
        self.rounds += 1
        for index in self._nonempty(keys=self._keys):
            queue = self.queues[int(index) - 1]
            for data in self.broker.do_fetch(queue, self.prefetch):
                self.messages += 1
                message = dramatiq.Message.decode(data)
                self.pool.submit(self._handle, queue, message)

    def _handle(self, queue: str, message: dramatiq.Message[Any]) -> None:
        redis_id = message.options["redis_message_id"]
        try:
            self.handler(queue, message)
        except Exception as exc:
            event(log, "message_failed", logging.WARNING, queue=queue, actor=message.actor_name, error=exc)
        finally:
            self.broker.do_ack(queue, redis_id)


class DramatiqConsumer:
    """A dramatiq Worker on every queue; one actor per message kind, told its queue by dramatiq's
    ``CurrentMessage`` middleware (an actor belongs to one queue, a message knows its own)."""

    def __init__(
        self, bus: Bus, queues: list[str], handler: Handler, actors: list[str], threads: int
    ) -> None:
        self.bus, self.queues, self.threads = bus, queues, threads
        broker = bus.broker
        broker.add_middleware(CurrentMessage())
        for queue in queues:
            broker.declare_queue(queue)
        for name in actors:
            dramatiq.Actor(
                self._actor(handler),
                broker=broker,
                actor_name=name,
                queue_name=queues[0],
                priority=0,
                options={},
            )
        self.worker: dramatiq.Worker | None = None

    @staticmethod
    def _actor(handler: Handler) -> Callable[..., None]:
        def actor(*_args: Any, **_kwargs: Any) -> None:
            message = CurrentMessage.get_current_message()
            assert message is not None
            handler(message.queue_name, message)

        return actor

    def start(self) -> None:
        self.worker = dramatiq.Worker(
            self.bus.broker,
            queues=set(self.queues),
            worker_threads=self.threads,
            worker_timeout=WORKER_TIMEOUT_MS,
        )
        self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop(timeout=5000)
