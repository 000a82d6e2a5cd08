"""What the parts of the node agent share: its stores, bus, GPUs, runtime and supervisor, and which
attempts it is working on right now.

The agent is three parts over these: the launcher (``launcher.py``: claim an attempt, build its
launch, start it through the runtime), the exit path (``exits.py``: the one way an attempt ends)
and the service (``service.py``: heartbeat, messages, reconcile and sweep loops), which builds
the other two and runs them on its threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fleet.agent.gpus import GpuInventory
from fleet.agent.logship import LogShipper
from fleet.agent.runtime import Runtime
from fleet.agent.stdin import StdinPumps
from fleet.agent.supervision import SupervisorClient
from fleet.bus import Bus
from fleet.bus.hints import Hints
from fleet.config import Settings
from fleet.config_sections import AgentSettings
from fleet.lifecycle import RetryPolicy
from fleet.state import JobStore, NodeStore

#: an attempt: (job id, attempt number)
Key = tuple[str, int]


class InFlight:
    """The attempts this agent is busy with, so that launching, finishing and reconciling one
    attempt never overlap, and a stop under way is not started again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[Key] = set()  # being launched or finished right now
        #: being stopped (a Stop message, or reconcile): reconcile must not stop them again with
        #: stop_grace_s, which would cut short the grace a preemption or a resize gave
        self.stopping: set[Key] = set()
        #: stopped at their time limit: their end is the time limit's (see exits.settle)
        self.timed_out: set[Key] = set()

    def claim(self, key: Key) -> bool:
        """Take ``key`` for this thread; False when another thread holds it."""
        with self._lock:
            if key in self._busy:
                return False
            self._busy.add(key)
            return True

    def release(self, key: Key) -> None:
        with self._lock:
            self._busy.discard(key)

    @contextmanager
    def held(self, key: Key) -> Iterator[bool]:
        """``claim`` for the block's length; yields whether it was claimed."""
        claimed = self.claim(key)
        try:
            yield claimed
        finally:
            if claimed:
                self.release(key)

    def busy(self) -> set[Key]:
        with self._lock:
            return set(self._busy)


@dataclass
class Parts:
    """Everything the launcher, the exit path and the service use alike."""

    settings: Settings
    jobs: JobStore
    nodes: NodeStore
    bus: Bus
    #: names to the controller the jobs whose attempts started or ended here (a thread sends them)
    hints: Hints
    inventory: GpuInventory
    runtime: Runtime
    supervisor: SupervisorClient
    logs: LogShipper
    #: the forwarded input of the attempts that read it
    stdin: StdinPumps
    clock: Callable[[], float]
    stop_event: threading.Event
    #: publish this node's GPUs now (a guarded heartbeat): one found busy, or not released
    publish: Callable[[], None]
    inflight: InFlight = field(default_factory=InFlight)

    @property
    def cfg(self) -> AgentSettings:
        return self.settings.agent

    @property
    def node(self) -> str:
        return self.settings.agent.node_name

    @property
    def policy(self) -> RetryPolicy:
        s = self.settings
        return RetryPolicy(s.retry_backoff_s, s.retry_backoff_max_s, s.max_infra_requeues)
