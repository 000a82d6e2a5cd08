"""Leader lease in Redis: SET NX PX plus a fencing token that every placement is checked against."""

from __future__ import annotations

import redis

from fleet.keys import Keys
from fleet.state.connection import load_scripts, translated
from fleet.versions import VERSION


class LeaderLease:
    def __init__(self, client: redis.Redis, keys: Keys, controller_id: str, ttl_s: float) -> None:
        self.keys, self.controller_id, self.ttl_ms = keys, controller_id, int(ttl_s * 1000)
        self._script = load_scripts(client)["leader"]
        #: "<controller id>:<token>" while this controller leads, else ""
        self.value = ""

    @translated
    def renew(self) -> bool:
        """Acquire or renew; True while this controller is the leader."""
        keys = [self.keys.leader, self.keys.leader_token, self.keys.leader_version]
        self.value = str(self._script(keys=keys, args=[self.controller_id, self.ttl_ms, self.value, VERSION]))
        return bool(self.value)
