"""Leadership: the lease in Redis (SET NX PX plus a fencing token that every write is checked
against), renewed on its own thread, and what holding it means for this controller.

While it leads, the controller consumes the controller queue (a follower leaves the messages to the
leader). A write fenced off (``NotLeader``) means another controller took the lease: ``fenced`` runs
each of the controller's steps and steps down at once on one, rather than at the next renewal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from fleet.bus import CONTROLLER_QUEUE, Bus
from fleet.errors import FleetError, NotLeader
from fleet.keys import Keys
from fleet.log import event
from fleet.state.connection import load_scripts, translated
from fleet.state.replication import confirmed
from fleet.versions import VERSION

log = logging.getLogger("fleet.controller")
T = TypeVar("T")


class LeaderLease:
    def __init__(self, client: redis.Redis, keys: Keys, controller_id: str, ttl_s: float) -> None:
        self.keys, self.controller_id, self.ttl_ms = keys, controller_id, int(ttl_s * 1000)
        self._client = client
        self._script = load_scripts(client)["leader"]
        #: "<controller id>:<token>" while this controller leads, else ""
        self.value = ""
        #: a lease acquired on the primary and not yet on its replicas: renewed, not yet led with
        self.pending = ""

    @translated
    def renew(self) -> bool:
        """Acquire or renew; True while this controller is the leader. A newly acquired lease counts
        once its fencing token is on the replicas: a replica promoted without it would hand the same
        token to another controller, and fencing tokens must only grow. A renewal is checked too,
        though it counts either way: one the replicas do not take may have reached a primary the
        sentinels deposed (cut off, and reached again before they demote it), which the check leaves
        (:func:`~fleet.state.sentinel.follow_primary`), so that the next renewal reaches the promoted
        replica rather than this one until it is demoted, with no leader there meanwhile."""
        keys = [self.keys.leader, self.keys.leader_token, self.keys.leader_version]
        held = self.value or self.pending
        value = str(self._script(keys=keys, args=[self.controller_id, self.ttl_ms, held, VERSION]))
        replicated = not value or confirmed(self._client, self.keys)
        if value and not self.value and not replicated:
            if value != self.pending:
                event(log, "leadership_not_replicated", logging.WARNING, id=self.controller_id, lease=value)
            self.pending = value
            return False
        self.value, self.pending = value, ""
        return bool(self.value)


class Leadership:
    def __init__(
        self, lease: LeaderLease, lease_s: float, bus: Bus, worker_threads: int, acquired: Callable[[], None]
    ) -> None:
        self.lease, self.lease_s, self.bus, self.worker_threads = lease, lease_s, bus, worker_threads
        #: called on the renewal thread when this controller becomes the leader
        self.acquired = acquired
        self._until = 0.0
        self._worker: Any = None

    @property
    def id(self) -> str:
        return self.lease.controller_id

    def leading(self) -> bool:
        """Holding the lease, with a renewal recent enough that it cannot have lapsed."""
        return bool(self.lease.value) and time.monotonic() < self._until

    def token(self) -> str:
        """The leader value every controller write is fenced by ('' would mean "not fenced")."""
        if not self.lease.value:
            raise NotLeader(f"controller {self.id} does not hold the leader lease")
        return self.lease.value

    def renew(self) -> None:
        """Acquire or renew the lease (on its own thread, so a long pass never loses it; a pass checks
        ``leading()`` before it places, and its writes are fenced by the token anyway)."""
        was = bool(self.lease.value)
        started = time.monotonic()
        try:
            leading = self.lease.renew()
        except FleetError:
            self.lease.value = ""
            raise
        finally:
            if was and not self.lease.value:
                event(log, "leadership_lost", id=self.id)
                self.follow()
        if leading:
            self._until = started + self.lease_s
        if leading and not was:
            event(log, "leadership_acquired", id=self.id, lease=self.lease.value)
            self._worker = self.bus.worker(CONTROLLER_QUEUE, self.worker_threads)
            self.acquired()

    def fenced(self, step: Callable[[], T], otherwise: T) -> T:
        """Run a step whose writes are fenced by the token; ``otherwise`` when one was refused."""
        try:
            return step()
        except NotLeader:
            self.deposed()
            return otherwise

    def deposed(self) -> None:
        """A fenced write was refused: another controller took the lease. Stop leading at once
        rather than at the next renewal; the renewal tries to acquire the lease again as a follower."""
        if self.lease.value:
            event(log, "leadership_lost", logging.WARNING, id=self.id, why="write fenced off")
        self.lease.value = ""
        self.follow()

    def follow(self) -> None:
        """Stop consuming the controller queue (a follower's messages are the leader's)."""
        if self._worker is not None:
            self._worker.stop(timeout=2000)
            self._worker = None
