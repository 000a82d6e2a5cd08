"""Acknowledged means replicated: a write fleet tells someone about is on ``redis_replicas_ack``
replicas first, so that a replica the sentinels promote holds it.

Redis replicates asynchronously: a primary that dies can take its last writes with it, and a
promoted replica answers as if they never happened. So after each write that someone acts on (a
submit or cancel its caller is told about, a placement agents start, an agent's start and exit of
an attempt, a leadership, a token or tenant change), fleet asks ``WAIT replicas timeout`` before it
answers, and a write not replicated in time raises :class:`NotReplicated`: retryable, the API's 503.
The write itself stands on the primary; retrying it is safe where the write is idempotent (a submit
with the caller's job id, a cancel, a token revoke), and the caller is told nothing it may rely on.

``WAIT`` counts the writes of the connection it is sent on, and a pooled client sends each command
on whichever connection is free; so the check writes a counter (``Keys.replicated``) and waits on
that connection. Redis replicates in order, and the write to acknowledge was answered before, so a
replica holding the counter's write holds it too. A write that falls short may have reached a primary
the sentinels deposed (cut off, then reachable again before they demote it): the check then asks
them, and leaves it (:func:`~fleet.state.sentinel.follow_primary`), so that the retry reaches the new one.

Not waited for, because nothing outside Redis acts on them being there: heartbeats (a lost one
costs the node a renewal, and the agent counts its lease only from renewals that were replicated,
:mod:`fleet.agent.service`), progress reports, log lines, metrics, the leader's waiting reasons and
status; and reads, of course.
"""

from __future__ import annotations

from typing import Any

from fleet.errors import NotReplicated
from fleet.keys import Keys
from fleet.state.connection import REPLICAS_ACK as _ACKS
from fleet.state.connection import translated
from fleet.state.sentinel import follow_primary


@translated
def replicas_holding(client: Any, keys: Keys) -> int | None:
    """How many replicas hold every write answered so far (None: ``client`` waits for none: only a
    client from :func:`~fleet.state.connection.connect` waits, for those its settings name)."""
    replicas, timeout_ms = getattr(client, _ACKS, (0, 0))
    if not replicas:
        return None
    pipe = client.pipeline(transaction=False)  # one connection: the counter's write, then WAIT on it
    pipe.incr(keys.replicated)
    pipe.wait(replicas, timeout_ms)
    held = int(pipe.execute()[1])
    if held < replicas:
        follow_primary(client)
    return held


def replicated(client: Any, keys: Keys, what: str) -> None:
    """Return once ``what`` (written before) is on the replicas ``client`` waits for; else raise
    :class:`NotReplicated` naming it."""
    held = replicas_holding(client, keys)
    replicas, timeout_ms = getattr(client, _ACKS, (0, 0))
    if held is not None and held < replicas:
        raise NotReplicated(
            f"not replicated yet: {what} reached the Redis primary but {held} of the {replicas} "
            f"replica(s) redis_replicas_ack asks for within {timeout_ms} ms; retry (a retry of the same "
            "call is safe: give a submit its own job id)"
        )


def confirmed(client: Any, keys: Keys) -> bool:
    """Whether the writes answered so far are on the replicas ``client`` waits for (no error)."""
    held = replicas_holding(client, keys)
    return held is None or held >= getattr(client, _ACKS, (0, 0))[0]
