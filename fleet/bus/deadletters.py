"""Dead letters: the messages dramatiq moved to a queue's dead-letter set (``<queue>.XQ``), logged
once each and trimmed to the newest few; and the names of dramatiq's keys of a queue.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import DecodeError
from dramatiq.middleware import Middleware

from fleet.log import event

log = logging.getLogger("fleet.bus")


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
            log,
            "message_dead_lettered",
            logging.WARNING,
            queue=message.queue_name,
            actor=message.actor_name,
            message_id=message.message_id,
            redis_message_id=message.options.get("redis_message_id"),
            error=message.options.get("fleet_error", "see previous log line"),
        )
        trim_dead_letters(broker, message.queue_name, self.keep)


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
