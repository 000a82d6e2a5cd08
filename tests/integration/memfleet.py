"""A controller and agents in the test's own thread: fake runtimes, a stub bus, one manual clock.

What a job goes through (placement, launch, exits, retries, time limits, cancels) is decided by the
real controller and agent code over a real Redis (the stores are Lua scripts there); only what runs
the attempts (``FakeRuntime``), what carries the messages (``StubBus``) and time (``ManualClock``)
are stand-ins. Nothing happens in the background: ``settle`` steps every part until no message is
left (waiting for what an agent leaves to a thread of its own, a stop), and ``advance`` moves time,
so a test decides exactly when each thing happens.

Keep the tests with real processes for what only they show (signals, output, limits, restarts).
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any, cast

from fleet.agent.gpus import SimulatedGpus
from fleet.agent.runtime.fake import FakeRuntime, FakeSupervisor, ManualClock
from fleet.agent.service import Agent
from fleet.agent.supervision import SupervisorClient
from fleet.bus import (
    CONTROLLER_QUEUE,
    AttemptUpdate,
    JobSubmitted,
    Launch,
    NodeChanged,
    QueueLeft,
    Rebatch,
    Stop,
    node_queue,
)
from fleet.bus.broker import Bus
from fleet.bus.stub import StubBus
from fleet.config import Settings, load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.models import Job, JobSpec
from fleet.state import JobStore, NodeStore, connect

#: rounds ``settle`` runs at most: far more than any job's path takes
ROUNDS = 50


class MemFleet:
    def __init__(self, redis_url: str, root: Path, nodes: dict[str, int], **settings: Any) -> None:
        """``nodes``: name -> GPUs. ``settings``: overrides, as ``load_settings`` takes them."""
        self.clock, self.bus, self.root = ManualClock(), StubBus(), root
        self.settings = self._settings(redis_url, "controller", settings)
        self.redis = connect(self.settings)
        self.jobs, self.nodes = JobStore(self.redis, Keys()), NodeStore(self.redis, Keys())
        #: the stand-ins, as the types the controller and agent take
        self._bus = cast(Bus, self.bus)
        self.controller = Controller(
            self.settings, self.jobs, self.nodes, self._bus, clock=self.clock, controller_id="mem"
        )
        for schema in (JobSubmitted, QueueLeft, AttemptUpdate, NodeChanged):
            self.bus.handle(CONTROLLER_QUEUE, schema, self.controller.on_message)
        self.agents: dict[str, Agent] = {}
        self.runtimes: dict[str, FakeRuntime] = {}
        for name, gpus in nodes.items():
            self._agent(redis_url, name, gpus, settings)
        self._ids = itertools.count(1)
        assert self.controller.lease.renew()
        self.controller.leadership.renew()  # leading, as its lease loop would make it
        self.settle()

    def _settings(self, redis_url: str, node: str, overrides: dict[str, Any]) -> Settings:
        agent = {
            "node_name": node,
            "state_dir": self.root / node,
            "metrics_port": 0,
            **overrides.pop("agent", {}),
        }
        controller = {"metrics_port": 0, **overrides.pop("controller", {})}
        return load_settings(
            redis_url=redis_url,
            controller=controller,
            agent=agent,
            checkpoint_root=self.root / "checkpoints",
            **overrides,
        )

    def _agent(self, redis_url: str, name: str, gpus: int, overrides: dict[str, Any]) -> None:
        settings = self._settings(redis_url, name, dict(overrides))
        runtime = FakeRuntime(name, clock=self.clock, sleep=self.clock.sleep, watch_s=None)
        agent = Agent(
            settings,
            self.jobs,
            self.nodes,
            self._bus,
            SimulatedGpus(name, gpus, "Sim", 1 << 30),
            runtime,
            cast(SupervisorClient, FakeSupervisor()),
            clock=self.clock,
            background=False,
        )
        self.bus.handle(node_queue(name), Launch, agent.on_launch)
        self.bus.handle(node_queue(name), Stop, agent.on_stop)
        self.bus.handle(node_queue(name), Rebatch, agent.on_rebatch)
        runtime.watch(agent.on_exit, agent.stop_event)
        agent.logs.start()
        self.agents[name], self.runtimes[name] = agent, runtime

    def submit(self, spec: JobSpec | dict[str, Any]) -> str:
        """Store a job and tell the controller, as the API does; its id."""
        job_id = f"mem{next(self._ids)}"
        self.jobs.create(job_id, spec if isinstance(spec, JobSpec) else JobSpec.parse(spec), self.clock())
        self.bus.send(CONTROLLER_QUEUE, JobSubmitted(job_id=job_id))
        return job_id

    def cancel(self, job_id: str) -> None:
        """Cancel as the API does: marked in state, and a stop sent to each node holding it."""
        self.jobs.request_cancel(job_id, self.clock())
        job = self.jobs.get(job_id)
        for node in job.nodes_held if job.state.on_node else []:
            stop = Stop(
                job_id=job_id,
                attempt=job.attempt,
                reason="cancelled by user",
                grace_s=self.settings.agent.stop_grace_s,
            )
            self.bus.send(node_queue(node), stop)

    def job(self, job_id: str) -> Job:
        return self.jobs.get(job_id)

    def settle(self) -> None:
        """Step every part until a round moves nothing: heartbeats, messages, the controller's
        passes, attempts ending by the clock, the agents' reconciles."""
        for _ in range(ROUNDS):
            before = set(threading.enumerate())
            for agent in self.agents.values():
                agent.heartbeat()
            moved = self.bus.deliver()
            self.controller.reconcile()
            self.controller.schedule_pass()
            moved += self.bus.deliver()
            for runtime in self.runtimes.values():
                runtime.poll()
            for agent in self.agents.values():
                agent.reconcile()
            for thread in set(threading.enumerate()) - before:  # a stop the agent left to a thread
                thread.join(timeout=10)
            moved += self.bus.deliver()
            if not moved:
                return
        raise AssertionError(f"the fleet did not settle in {ROUNDS} rounds")

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass, then settle."""
        self.clock.advance(seconds)
        self.settle()

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop_event.set()
            agent.logs.close()
        self.redis.close()
