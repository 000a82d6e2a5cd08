"""A node whose own lease confirmation lapsed (its heartbeats late, as on a CPU-starved machine)
slows down: the supervisor refuses to start attempts until the lease is confirmed again (a refused
launch heartbeats and tries once more), the jobs it still cannot start go back to the queue without
spending their retries, and the node is not quarantined for it.

A real Redis, the node supervisor and the process runtime; the agent and controller are stepped by
the test, so its heartbeats stop exactly when the test says (as a starved heartbeat thread's do).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from fleet.agent.cgroups import Cgroups, Layout
from fleet.agent.gpus.simulated import SimulatedGpus
from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.service import Agent
from fleet.agent.supervision import SupervisorClient
from fleet.bus import (
    CONTROLLER_QUEUE,
    AttemptUpdate,
    JobSubmitted,
    Launch,
    NodeChanged,
    QueueLeft,
    node_queue,
)
from fleet.bus.broker import Bus
from fleet.bus.stub import StubBus
from fleet.config import load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.models import JobSpec, JobState, NodeState
from fleet.state import JobStore, NodeStore, connect

pytestmark = pytest.mark.integration
NODE = "t-starved"
#: the Redis lease lasts 30 s, but the supervisor holds a confirmation only 0.5 s (30 - 29.5)
AGENT = {"node_lease_ttl_s": 30.0, "fence_margin_s": 29.5, "heartbeat_interval_s": 0.2}


class Stepped:
    """One process-runtime agent and a controller, over a stub bus, stepped by the test."""

    def __init__(self, redis_url: str, root: Path) -> None:
        agent = {"node_name": NODE, "state_dir": root / NODE, "metrics_port": 0, "runtime": "process"}
        self.settings = load_settings(
            redis_url=redis_url,
            controller={"metrics_port": 0},
            agent={**agent, **AGENT, "max_prepare_failures": 1},
            checkpoint_root=root / "checkpoints",
        )
        cfg, self.root = self.settings.agent, root
        self.redis = connect(self.settings)
        self.jobs, self.nodes = JobStore(self.redis, Keys()), NodeStore(self.redis, Keys())
        self.bus = StubBus()
        bus = cast(Bus, self.bus)
        self.controller = Controller(self.settings, self.jobs, self.nodes, bus, controller_id="c")
        for schema in (JobSubmitted, QueueLeft, AttemptUpdate, NodeChanged):
            self.bus.handle(CONTROLLER_QUEUE, schema, self.controller.on_message)
        self.supervisor = SupervisorClient(cfg.state_dir, cfg.fence_margin_s, tick_s=0.05, idle_exit_s=60)
        cgroups = Cgroups(Layout("none", why="not needed here"), cfg.cgroup_parent, NODE)
        self.runtime = ProcessRuntime(NODE, cfg.state_dir / "attempts", self.supervisor, cgroups)
        gpus = SimulatedGpus(NODE, 0, "Sim", 1 << 30)
        self.agent = Agent(self.settings, self.jobs, self.nodes, bus, gpus, self.runtime, self.supervisor)
        self.agent.background = False
        self.bus.handle(node_queue(NODE), Launch, self.agent.on_launch)
        self.agent.supervisor.ensure()
        assert self.controller.lease.renew()
        self.controller.leadership.renew()

    def step(self, heartbeat: bool = True) -> None:
        """One round: the agent's heartbeat (unless it is late), messages, the controller's passes,
        the agent's reconcile (which finishes the attempts that exited)."""
        if heartbeat:
            self.agent.heartbeat()
        self.bus.deliver()
        self.controller.reconcile()
        self.controller.schedule_pass()
        self.bus.deliver()
        self.agent.reconcile()
        self.bus.deliver()

    def submit(self, job_id: str) -> str:
        spec = JobSpec(name="zero-gpu", gpus=0, command=[sys.executable, "-c", "print('ran')"])
        self.jobs.create(job_id, spec, time.time())
        self.bus.send(CONTROLLER_QUEUE, JobSubmitted(job_id=job_id))
        return job_id

    def close(self) -> None:
        self.agent.stop_event.set()
        self.supervisor.shutdown()
        self.supervisor.close()
        self.redis.close()


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[Stepped]:
    held = Stepped(redis_url, tmp_path)
    yield held
    held.close()


def lapse(fleet: Stepped) -> None:
    """The agent's heartbeats stop for longer than the supervisor holds a confirmation (the Redis
    lease, 30 s, still holds: the controller still places jobs on the node)."""
    fleet.agent.heartbeat()
    time.sleep(AGENT["node_lease_ttl_s"] - AGENT["fence_margin_s"] + 0.2)


def test_a_start_refused_for_the_nodes_own_lease_requeues_and_does_not_quarantine(
    fleet: Stepped, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a node whose lease confirmation lapsed while its Redis lease holds, its heartbeats
    # stalled (even the one a refused launch asks for)
    fleet.step()
    lapse(fleet)
    monkeypatch.setattr(fleet.agent, "heartbeat", lambda: None)
    # When a job is placed on it
    job_id = fleet.submit("starved1")
    fleet.step(heartbeat=False)
    # Then the supervisor refused to start it, and it went back to the queue, its retries not spent
    job = fleet.jobs.get(job_id)
    history = [e.reason for e in fleet.jobs.history(job_id)]
    assert job.state == JobState.QUEUED, history
    assert any("node lease not confirmed" in r and "retry budget not spent" in r for r in history), history
    assert job.failures == 0
    # And the node was not quarantined for it (max_prepare_failures is 1 here)
    node = fleet.nodes.get(NODE)
    assert node.admin_state == NodeState.READY, node.reason
    # When its heartbeats resume, the job runs there to success
    monkeypatch.undo()
    deadline = time.monotonic() + 60
    while fleet.jobs.get(job_id).state != JobState.SUCCEEDED and time.monotonic() < deadline:
        fleet.step()
        time.sleep(0.05)
    job = fleet.jobs.get(job_id)
    assert (job.state, job.nodes_held, job.failures) == (JobState.SUCCEEDED, [NODE], 0)


def test_a_start_refused_for_a_late_heartbeat_starts_once_a_heartbeat_confirms_it(fleet: Stepped) -> None:
    # Given a node whose lease confirmation lapsed because its heartbeat thread is late (Redis
    # answers: a heartbeat now would reach it)
    fleet.step()
    lapse(fleet)
    # When a job is placed on it before that thread's next heartbeat
    job_id = fleet.submit("starved2")
    fleet.step(heartbeat=False)
    # Then the launch confirmed the lease with a heartbeat of its own and started its first attempt,
    # never requeued, the node left READY
    job = fleet.jobs.get(job_id)
    assert job.state in (JobState.RUNNING, JobState.SUCCEEDED) and job.attempt == 1, job.state
    assert not any(e.state == "QUEUED" and e.reason != "submitted" for e in fleet.jobs.history(job_id))
    assert fleet.nodes.get(NODE).admin_state == NodeState.READY


def test_a_lease_confirmation_does_not_wait_behind_a_launch(tmp_path: Path) -> None:
    # Given a node supervisor whose lease is not confirmed, and a launch holding the agent's
    # connection to it (a spawn under way, slow on a starved machine)
    supervisor = SupervisorClient(tmp_path / "node", 0.5, tick_s=0.05, idle_exit_s=60)
    supervisor.ensure()
    try:
        with supervisor._lock:
            # When the heartbeat confirms the lease meanwhile
            confirm = threading.Thread(target=supervisor.lease, args=(time.monotonic() + 30,), daemon=True)
            confirm.start()
            confirm.join(timeout=20)
            # Then the confirmation reached the supervisor without waiting for the launch
            assert not confirm.is_alive()
        # And the supervisor, its lease confirmed, starts attempts
        assert supervisor.spawn("j1.1", ["true"], {}, str(tmp_path), None, None) > 0
    finally:
        supervisor.shutdown()
        supervisor.close()
