"""A controller in the test's own process, over a real Redis and bus, for tests that must decide
exactly when it acts (its passes are called directly; nothing runs in the background)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fleet.bus import Bus
from fleet.config import load_settings
from fleet.controller.service import Controller
from fleet.keys import Keys
from fleet.models import Gpu, JobSpec, JobState
from fleet.state import JobStore, NodeStore, connect
from fleet.state.nodes import NodeInfo


def info(node: str, gpus: int = 1) -> NodeInfo:
    inventory = [Gpu(uuid=f"{node}-g{i}", index=i, model="Sim", memory_total=1 << 30) for i in range(gpus)]
    return NodeInfo(gpus=inventory, cpus=1, memory=1 << 30, runtime="process", gpu_backend="simulated")


class Harness:
    def __init__(self, redis_url: str, clock: Callable[[], float] = time.time, **settings: Any) -> None:
        controller = {"metrics_port": 0, **settings.pop("controller", {})}
        self.settings = load_settings(redis_url=redis_url, controller=controller, **settings)
        self.client = connect(self.settings)
        self.jobs, self.nodes = JobStore(self.client, Keys()), NodeStore(self.client, Keys())
        self.bus = Bus(self.settings)
        self.controller = Controller(
            self.settings, self.jobs, self.nodes, self.bus, clock=clock, controller_id="c1"
        )

    def lead(self) -> None:
        """Take the lease as the controller's renewal thread does (its passes then act)."""
        self.controller.leadership.renew()
        assert self.controller.leadership.leading()

    def node(self, name: str, ttl_s: float = 60, gpus: int = 1) -> None:
        """A live node, as its agent's heartbeat registers it."""
        self.nodes.heartbeat(name, f"agent-{name}", ttl_s, time.time(), info(name, gpus))

    def running(self, job_id: str, node: str) -> None:
        """A 1-GPU job placed on ``node`` by this controller and started there."""
        self.jobs.create(job_id, JobSpec(name="j", command=["sleep", "1"], gpus=1), time.time())
        leader = self.controller.lease.value
        assert self.jobs.place(job_id, node, [f"{node}-g0"], leader, time.time(), "placed")
        for to in (JobState.STARTING, JobState.RUNNING):
            self.jobs.transition(
                job_id,
                attempt=1,
                allowed=[JobState.SCHEDULED, JobState.STARTING],
                to=to,
                reason="",
                now=time.time(),
            )

    def running_gang(self, job_id: str, nodes: list[str]) -> None:
        """A multi-node job of one GPU per node (``<node>-g0``) placed on ``nodes`` and RUNNING there,
        every member run as the agents' do."""
        spec = JobSpec(name="gang", command=["sleep", "1"], gpus=len(nodes), nodes=len(nodes))
        self.jobs.create(job_id, spec, time.time())
        members = [{"node": n, "gpus": [f"{n}-g0"], "cpus": 0, "memory": 0} for n in nodes]
        entry = {
            "job": job_id,
            "node": nodes[0],
            "gpus": members[0]["gpus"],
            "cpus": 0,
            "memory": 0,
            "reason": "placed",
            "members": members,
            "master_addr": "127.0.0.1",
        }
        assert self.jobs.place_many([entry], self.controller.lease.value, time.time()) == [1]
        job = self.jobs.get(job_id)
        for rank in range(len(nodes)):
            self.jobs.member(job, rank, "starting")
            self.jobs.member(job, rank, "running")
        for to in (JobState.STARTING, JobState.RUNNING):
            self.jobs.transition(
                job_id,
                attempt=1,
                allowed=[JobState.SCHEDULED, JobState.STARTING],
                to=to,
                reason="",
                now=time.time(),
            )

    def close(self) -> None:
        self.controller.leadership.follow()
        self.bus.close()
        self.client.close()
