"""Wake-ups, so that an idle consumer blocks on Redis instead of polling dramatiq's ``fetch``.

dramatiq's Redis consumer never blocks: on an empty queue it sleeps and fetches again. fleet's
consumer fetches, and when nothing came, blocks (BLPOP) on its queue's wake list until a producer
pushes a token there after an enqueue, its own stop list gets a token, or ``bus_poll_ms`` passes;
then it fetches again. Keys (bus DB, listed in ``fleet/keys.py``):

- ``fleet:__wake__.<queue>``: list, at most one token, expiring: "``<queue>`` may have news";
- ``fleet:__stop__.<broker id>.<queue>``: list, a stop token for one process's consumer of
  ``<queue>``, so that stopping a worker does not wait out its block.

A token is a hint; the message itself travels through dramatiq's keys only, with dramatiq's acks,
nacks, redelivery and dead letters. A consumer fetches before it blocks and after every wake-up or
timeout, so a lost token costs at most one ``bus_poll_ms`` and a duplicated one an empty fetch.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

#: a token only needs to outlive the moment between a consumer's empty fetch and its BLPOP; one
#: nobody took must not make a consumer that starts much later (which fetches first anyway) fetch twice
TOKEN_TTL_MS = 60_000


def wake_list(namespace: str, queue: str) -> str:
    return f"{namespace}:__wake__.{queue}"


def stop_list(namespace: str, broker_id: str, queue: str) -> str:
    return f"{namespace}:__stop__.{broker_id}.{queue}"


def push(client: redis.Redis, key: str) -> None:
    """Leave one token on ``key`` (a burst of sends leaves one, not one each), in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, 1)
    pipe.ltrim(key, 0, 0)
    pipe.pexpire(key, TOKEN_TTL_MS)
    pipe.execute()


class Waiter:
    """One consumer's blocking wait, on a connection of its own: BLPOP holds the connection for the
    whole block, and its socket timeout must be longer than the block."""

    def __init__(self, connect: Callable[[float], redis.Redis], keys: list[str], timeout_s: float) -> None:
        self.keys, self.timeout_s = keys, timeout_s
        self.client = connect(timeout_s + 5)

    def wait(self) -> bool:
        """Block until a token arrives (True) or ``timeout_s`` passes (False)."""
        return self.client.blpop(self.keys, timeout=self.timeout_s) is not None

    def close(self) -> None:
        self.client.close()
        self.client.connection_pool.disconnect()  # the client closes only pools it made itself
