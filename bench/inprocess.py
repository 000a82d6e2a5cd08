"""A controller and an agent in the benchmark's own process (4 simulated GPUs, the process runtime),
on a flushed Redis: what the dispatch and webhook benchmarks time their jobs through."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fleet.agent.gpus import SimulatedGpus
from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.service import Agent
from fleet.agent.supervision import SupervisorClient
from fleet.api.backend import Backend
from fleet.bus import Bus
from fleet.config import Settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.state import JobStore, NodeStore, connect


@contextmanager
def in_process_fleet(
    settings: Settings, runtime_class: type[ProcessRuntime] = ProcessRuntime
) -> Iterator[tuple[Backend, ProcessRuntime]]:
    """(a client, the agent's runtime) once the node is up and a second has passed."""
    connect(settings).flushall()
    keys = Keys(settings.key_prefix)
    supervisor = SupervisorClient(settings.agent.state_dir, settings.agent.fence_margin_s)
    runtime = runtime_class("bench", settings.agent.state_dir / "attempts", supervisor)
    agent = Agent(
        settings,
        JobStore(connect(settings), keys),
        NodeStore(connect(settings), keys),
        Bus(settings),
        SimulatedGpus("bench", 4, "sim", 1 << 30),
        runtime,
        supervisor,
    )
    controller = Controller(
        settings, JobStore(connect(settings), keys), NodeStore(connect(settings), keys), Bus(settings)
    )
    threads = [threading.Thread(target=s.run, daemon=True) for s in (controller, agent)]
    for t in threads:
        t.start()
    client = Backend(settings=settings)
    try:
        while not any(n.alive for n in client.nodes()):
            time.sleep(0.05)
        time.sleep(1)
        yield client, runtime
    finally:
        agent.stop_event.set()
        controller.stop_event.set()
        controller._wake.set()
        for t in threads:
            t.join(timeout=10)
        supervisor.shutdown()
        client.close()
