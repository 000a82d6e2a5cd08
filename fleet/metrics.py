"""Prometheus metrics (``prometheus-client``), one registry per service, served over HTTP.

The controller's gauges are read from Redis at scrape time (state is the truth, and any
controller, leader or not, reports the same numbers); its scheduling latency is observed in
process. Requeue counts live in Redis (``<prefix>:metrics:requeues``) because agents and the
controller both requeue.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleet.log import event
from fleet.models import NodeState
from fleet.state.connection import used_memory
from fleet.state.sentinel import failover_count

if TYPE_CHECKING:
    from fleet.agent.gpus.base import GpuInventory
    from fleet.agent.runtime.base import Runtime
    from fleet.state import JobStore, NodeStore
    from fleet.state.redisinfo import RedisWatch
    from fleet.state.tenants import TenantStore


def serve(registry: CollectorRegistry, port: int, address: str, log: logging.Logger) -> None:
    """Serve ``/metrics`` on ``address:port`` (port 0: off); a port in use is logged, never fatal."""
    if not port:
        return
    try:
        start_http_server(port, addr=address, registry=registry)
        event(log, "metrics_serving", address=address, port=port)
    except OSError as exc:
        event(log, "metrics_unavailable", logging.WARNING, address=address, port=port, error=exc)


class ControllerCollector(Collector):
    def __init__(self, jobs: JobStore, nodes: NodeStore, tenants: TenantStore | None = None) -> None:
        self.jobs, self.nodes, self.tenants = jobs, nodes, tenants

    def collect(self) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("fleet_jobs", "Jobs by state", labels=["state"])
        for state, count in self.jobs.count_by_state().items():
            by_state.add_metric([state.value], count)
        yield by_state
        queued = GaugeMetricFamily(
            "fleet_jobs_queued", "Queued jobs by tenant and priority", labels=["tenant", "priority"]
        )
        for (tenant, priority), count in Counter(
            (j.spec.tenant, str(j.spec.priority)) for j in self.jobs.queued()
        ).items():
            queued.add_metric([tenant, priority], count)
        yield queued
        yield from self._gpus_and_nodes()
        requeues = GaugeMetricFamily(
            "fleet_requeues", "Requeues since the fleet started, by kind", labels=["kind"]
        )
        for kind, count in self.jobs.requeue_counts().items():
            requeues.add_metric([kind], count)
        yield requeues
        if self.tenants is not None:
            preempted = GaugeMetricFamily(
                "fleet_preemptions",
                "Jobs preempted since the fleet started, by their tenant",
                labels=["tenant"],
            )
            for tenant, count in self.tenants.preemption_counts().items():
                preempted.add_metric([tenant], count)
            yield preempted
        memory = GaugeMetricFamily(
            "fleet_redis_memory_bytes", "Memory Redis holds for fleet's state and bus (INFO used_memory)"
        )
        memory.add_metric([], used_memory(self.jobs.redis))
        yield memory

    def _gpus_and_nodes(self) -> Iterator[Metric]:
        nodes = self.nodes.all()
        gpus = GaugeMetricFamily("fleet_gpus", "GPUs of live nodes by status", labels=["status"])
        live = [g for n in nodes if n.alive for g in n.gpus]
        claimed = {u for n in nodes for u in n.claims}
        gpus.add_metric(["total"], len(live))
        gpus.add_metric(["claimed"], sum(1 for g in live if g.uuid in claimed))
        gpus.add_metric(["unhealthy"], sum(1 for g in live if not g.healthy))
        gpus.add_metric(["busy"], sum(1 for g in live if g.busy))
        yield gpus
        states = GaugeMetricFamily("fleet_nodes", "Nodes by state", labels=["state"])
        for state in NodeState:
            states.add_metric([state.value], sum(1 for n in nodes if n.state == state))
        yield states


class RedisCollector(Collector):
    """The failovers this service saw; given a watch (the controller's), which Redis is primary, its
    replicas' lag and the sentinels that agree, read at most every few seconds however often scraped."""

    def __init__(self, watch: RedisWatch | None = None) -> None:
        self.watch = watch

    def collect(self) -> Iterator[Metric]:
        failovers = CounterMetricFamily(
            "fleet_redis_failovers", "Redis failovers this service saw (on reaching a new primary)"
        )
        failovers.add_metric([], failover_count())
        yield failovers
        status = self.watch.status() if self.watch is not None else None
        if status is None or status.error:
            return
        connected = GaugeMetricFamily("fleet_redis_replicas_connected", "Replicas in sync with the primary")
        connected.add_metric([], sum(1 for r in status.replicas if r.state == "online"))
        yield connected
        labels = ["replica"]
        lag = GaugeMetricFamily(
            "fleet_redis_replica_lag_bytes",
            "Replication stream a replica has not acknowledged",
            labels=labels,
        )
        since = GaugeMetricFamily(
            "fleet_redis_replica_lag_seconds", "Seconds since a replica last acknowledged", labels=labels
        )
        for r in status.replicas:
            lag.add_metric([r.address], r.lag_bytes)
            since.add_metric([r.address], r.lag_s)
        yield from (lag, since)
        if status.sentinels:
            agree = GaugeMetricFamily("fleet_redis_sentinels_agreeing", "Sentinels that name the primary")
            agree.add_metric([], status.sentinels_agreeing)
            yield agree


def controller_registry(
    jobs: JobStore, nodes: NodeStore, tenants: TenantStore | None = None, watch: RedisWatch | None = None
) -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    registry.register(ControllerCollector(jobs, nodes, tenants))
    registry.register(RedisCollector(watch))
    latency = Histogram(
        "fleet_schedule_pass_seconds",
        "Duration of a scheduling pass",
        registry=registry,
        buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    )
    return registry, latency


class Metered(Protocol):
    """What the agent's metrics read of it (an agent, without importing the agent)."""

    node: str
    inventory: GpuInventory
    runtime: Runtime
    renewed_at: float


class AgentCollector(Collector):
    def __init__(self, agent: Metered, clock: Callable[[], float]) -> None:
        self.agent, self.clock = agent, clock

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "gpu", "uuid"]
        util = GaugeMetricFamily("fleet_agent_gpu_utilization_percent", "GPU utilisation", labels=labels)
        used = GaugeMetricFamily("fleet_agent_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("fleet_agent_gpu_memory_total_bytes", "GPU memory", labels=labels)
        temp = GaugeMetricFamily("fleet_agent_gpu_temperature_celsius", "GPU temperature", labels=labels)
        node = self.agent.node
        for g in self.agent.inventory.gpus():
            key = [node, str(g.index), g.uuid]
            util.add_metric(key, g.utilization)
            used.add_metric(key, g.memory_used)
            total.add_metric(key, g.memory_total)
            if g.temperature is not None:
                temp.add_metric(key, g.temperature)
        yield from (util, used, total, temp)
        running = GaugeMetricFamily("fleet_agent_attempts_running", "Job attempts running", labels=["node"])
        running.add_metric([node], sum(1 for a in self.agent.runtime.attempts() if a.running))
        yield running
        lag = GaugeMetricFamily(
            "fleet_agent_heartbeat_lag_seconds", "Seconds since the lease was renewed", labels=["node"]
        )
        lag.add_metric([node], self.clock() - self.agent.renewed_at)
        yield lag


def agent_registry(agent: Metered, clock: Callable[[], float]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, clock))
    registry.register(RedisCollector())
    return registry
