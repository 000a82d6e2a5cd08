"""Acknowledged means replicated: what fleet acknowledges is on a replica, and a replica promoted
without the primary's last writes runs nothing twice.

Real redis-servers and sentinels (those of ``fleet up --ha``). Replication is cut as a network
would cut it: the primary drops its replicas' links, and they cannot log in again (a wrong
``masterauth``) until the test heals them, so the primary takes writes they never see. (Stopping
the replicas with SIGSTOP would not do: what the primary sent waits in their sockets, and they read
it when they run again, even with the primary dead.)
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from bench.procs import LASTING_LEASE, DirectClient, FleetProcs
from fleet import JobSpec, JobState
from fleet.config import load_settings
from fleet.errors import NotFound, NotReplicated, StoreUnavailable
from fleet.keys import Keys
from fleet.models import Job, NodeState, Role
from fleet.ops import redis_local
from fleet.ops.redis_local import LocalRedis
from fleet.state import Stores
from tests.integration.conftest import primary_port
from tests.support import until, wait_for

pytestmark = pytest.mark.integration

REPLICAS = ("redis-1", "redis-2")


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def ha_timings() -> redis_local.Timings:
    """The installed sentinels' 3 s (config/sentinel.conf), not ``fleet up``'s 1 s: on a loaded
    machine a sentinel once took a primary it had just switched to for down (no answer for 1 s) and
    failed over again, and the primary it demoted had to resync for 10 s, longer than a node lease:
    what these tests check (acknowledged writes, one failover) needs the failover to be one."""
    return redis_local.Timings(down_after_ms=3000)


@pytest.fixture
def acks(ha: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> LocalRedis:
    """The HA set, with acknowledged writes waiting 200 ms for a replica (services and tests alike)."""
    monkeypatch.setenv("FLEET_REDIS_REPLICAS_ACK_TIMEOUT_MS", "200")
    return ha


def cut(ha: LocalRedis) -> list[int]:
    """Cut the replicas off the primary (they stay up, their links down); their ports."""
    with primary(ha) as source:
        ports = [int(source.info("replication")[f"slave{n}"]["port"]) for n in range(len(REPLICAS))]
        for port in ports:
            with replica(ha, port) as r:
                r.config_set("masterauth", "not-the-password")
        source.client_kill_filter(_type="replica")
    for port in ports:
        with replica(ha, port) as r:
            wait_for(lambda r=r: r.info("replication")["master_link_status"] == "down", 10, "link down")
    return ports


def heal(ha: LocalRedis, ports: list[int]) -> None:
    """Let the replicas log in to a primary again (the old one, or the one the sentinels promote)."""
    for port in ports:
        with replica(ha, port) as r:
            r.config_set("masterauth", ha.password_file.read_text().strip())


def replica(ha: LocalRedis, port: int) -> redis.Redis:
    return redis.Redis(port=port, password=ha.password_file.read_text().strip(), decode_responses=True)


def primary(ha: LocalRedis) -> redis.Redis:
    """A client of the primary itself (not through the sentinels)."""
    password = ha.password_file.read_text().strip()
    return redis.Redis(port=primary_port(ha), password=password, decode_responses=True)


def test_a_write_no_replica_took_is_not_acknowledged_and_a_retry_makes_one_job(acks: LocalRedis) -> None:
    # Given a client of the fleet's Redis, and replicas cut off the primary
    client = DirectClient(settings=load_settings())
    stores = Stores.open(load_settings())
    ports = cut(acks)
    try:
        # When a job is submitted with the caller's id, or a token made
        spec = JobSpec(name="once", command=["true"])
        # Then neither is acknowledged: the caller hears "not replicated yet; retry", a 503 of the API
        with pytest.raises(NotReplicated, match=r"not replicated yet: the submit of job once .* retry"):
            client.submit(spec, job_id="once")
        with pytest.raises(NotReplicated, match="not replicated yet: token"):
            stores.tokens.create("someone", "default", Role.USER)
        # And once the replicas take writes again, the same submit retried is acknowledged
        heal(acks, ports)
        handle = until(lambda: _submitted(client, spec, "once"), "the retried submit acknowledged")
        # And it made one job, not two
        assert handle.id == "once"
        assert [job.id for job in client.jobs() if job.spec.name == "once"] == ["once"]
    finally:
        stores.close()
        client.close()


def _submitted(client: DirectClient, spec: JobSpec, job_id: str) -> object:
    try:
        return client.submit(spec, job_id=job_id)
    except StoreUnavailable:
        return None


def test_a_controller_leads_only_once_its_fencing_token_is_replicated(
    acks: LocalRedis, tmp_path: Path
) -> None:
    # Given replicas cut off the primary
    procs = FleetProcs(acks.url, tmp_path, "process")
    procs.env.update(LASTING_LEASE)  # a node lease that outlasts a failover
    keys = Keys(load_settings().key_prefix)
    ports = cut(acks)
    try:
        with primary(acks) as old:
            # When a controller takes the leader lease, on the primary alone
            procs.controller()
            wait_for(lambda: old.get(keys.leader), 30, "the lease taken on the primary", procs)
            token = old.get(keys.leader_token)
            # Then it does not lead with a token a promoted replica would hand out again
            wait_for(lambda: "leadership_not_replicated" in procs.logs(), 30, "a lease held back", procs)
            assert "leadership_acquired" not in procs.logs()
            # And once the replicas hold the token, it leads with it
            heal(acks, ports)
            wait_for(lambda: "leadership_acquired" in procs.logs(), 30, "a leader", procs)
            assert f"lease={old.get(keys.leader)}" in procs.logs() and old.get(keys.leader_token) == token
    finally:
        procs.stop()


TICKS = 100
#: a job that ticks into a file of its own run (attempt and pid): two runs of one attempt show
TICKER = (
    "import os, time\n"
    "name = 'run-%s-%d' % (os.environ['FLEET_ATTEMPT'], os.getpid())\n"
    f"for _ in range({TICKS}):\n"
    "    with open(os.path.join(os.environ['TICKS'], name), 'a') as f: f.write(repr(time.time()) + '\\n')\n"
    "    time.sleep(0.05)\n"
)


def test_a_placement_the_promoted_replica_never_saw_runs_the_job_once(
    acks: LocalRedis, tmp_path: Path
) -> None:
    # Given a controller, nodes t-a and t-b both cordoned, and a job acknowledged (on the replicas)
    procs = FleetProcs(acks.url, tmp_path, "process")
    procs.env.update(LASTING_LEASE)  # a node lease that outlasts a failover
    client = DirectClient(settings=load_settings())
    ticks = tmp_path / "ticks"
    ticks.mkdir(mode=0o777)
    ticks.chmod(0o777)  # the job runs as the unprivileged job user
    spec = JobSpec(name="tick", gpus=1, command=[sys.executable, "-c", TICKER], env={"TICKS": str(ticks)})
    keys = Keys(load_settings().key_prefix)
    try:
        procs.controller()
        procs.agent("t-a", gpus=1)
        procs.agent("t-b", gpus=1)
        procs.wait_nodes(client, 2)
        client.cordon("t-a")
        client.cordon("t-b")
        job = client.submit(spec, job_id="once")
        with primary(acks) as old:
            wait_for(lambda: "leadership_acquired" in procs.logs(), 30, "a leader", procs)
            token_before = int(old.get(keys.leader_token) or 0)
            # And replicas cut off the primary from here
            ports = cut(acks)
            old.set("test:after-cut", 1)
            # When an operator uncordons t-a, on the primary alone (not acknowledged: the write stands
            # there), and the controller places the job on t-a
            with pytest.raises(NotReplicated, match="the state of node t-a"):
                client.uncordon("t-a")
            placed = lambda: old.hget(keys.job("once"), "node") == "t-a"  # noqa: E731
            wait_for(placed, 30, "the job placed on the primary", procs)
            refused = "not replicated yet: the start of job once"
            wait_for(lambda: refused in procs.logs() or list(ticks.iterdir()), 30, "a start tried", procs)
            # Then t-a started nothing the replicas do not know of
            assert list(ticks.iterdir()) == []
            # When the primary dies and the sentinels promote a replica that never saw the placement
            port = primary_port(acks)
            acks.procs["redis-0"].send_signal(signal.SIGKILL)
            acks.procs["redis-0"].wait()
        heal(acks, ports)
        until(lambda: primary_port(acks) != port, "a replica promoted", timeout=60)
        with primary(acks) as new:  # one that lacks every write the primary took after the cut
            assert new.exists("test:after-cut") == 0
            assert new.hget(keys.node("t-a"), "state") == NodeState.CORDONED  # the uncordon is lost too
            until(lambda: _replicating(new), "a replica taking the new primary's writes", timeout=60)
        # And an operator uncordons t-b
        until(lambda: _done(lambda: client.uncordon("t-b")), "t-b uncordoned", timeout=30)
        # Then the job runs to the end there, on the services that were already running
        done = until(lambda: _ended(client, job.id), "the job ended", timeout=120)
        assert (done.state, done.node) == (JobState.SUCCEEDED, "t-b"), procs.logs()
        # Exactly once: one run, whole
        runs = sorted(ticks.iterdir())
        assert [len(run.read_text().split()) for run in runs] == [TICKS], (runs, procs.logs())
        # And the fencing token and the attempts only went up, and no GPU is left claimed
        with primary(acks) as new:
            assert int(new.get(keys.leader_token) or 0) >= token_before
            assert new.hgetall(keys.claims) == {}
        attempts = [event.attempt for event in client.history(job.id)]
        assert attempts == sorted(attempts) and done.attempt == attempts[-1] >= 1
        assert not [name for name, proc in procs.procs.items() if proc.poll() is not None]
    finally:
        procs.stop()
        client.close()


def _replicating(source: redis.Redis) -> bool:
    """Whether a replica holds a write made now on ``source`` within a second (WAIT on its connection)."""
    pipe = source.pipeline(transaction=False)
    pipe.incr("test:probe")
    pipe.wait(1, 1000)
    return int(pipe.execute()[1]) >= 1


#: a job that ticks into a file of its own run until the test writes ``stop``, then exits 0
UNTIL_STOPPED = (
    "import os, time\n"
    "name = os.path.join(os.environ['TICKS'], 'run-%s-%d' % (os.environ['FLEET_ATTEMPT'], os.getpid()))\n"
    "while not os.path.exists(os.path.join(os.environ['TICKS'], 'stop')):\n"
    "    with open(name, 'a') as f: f.write(repr(time.time()) + '\\n')\n"
    "    time.sleep(0.05)\n"
)


def test_an_exit_the_promoted_replica_never_saw_does_not_run_the_job_again(
    acks: LocalRedis, tmp_path: Path
) -> None:
    # Given a job RUNNING on t-a, as the replicas know
    procs = FleetProcs(acks.url, tmp_path, "process")
    procs.env.update(LASTING_LEASE)  # a node lease that outlasts a failover
    client = DirectClient(settings=load_settings())
    ticks = tmp_path / "ticks"
    ticks.mkdir(mode=0o777)
    ticks.chmod(0o777)  # the job runs as the unprivileged job user
    command = [sys.executable, "-c", UNTIL_STOPPED]
    spec = JobSpec(name="tick", gpus=1, command=command, env={"TICKS": str(ticks)})
    keys = Keys(load_settings().key_prefix)
    try:
        procs.one_node(client, "t-a", gpus=1)
        job = client.submit(spec, job_id="once")
        wait_for(lambda: list(ticks.glob("run-*")), 30, "the job ticking", procs)
        with primary(acks) as old:
            for n in range(len(REPLICAS)):
                with replica(acks, int(old.info("replication")[f"slave{n}"]["port"])) as r:
                    running = lambda r=r: r.hget(keys.job("once"), "state") == JobState.RUNNING  # noqa: E731
                    wait_for(running, 30, "RUNNING on the replica", procs)
            # When the replicas are cut off the primary and the job ends on it alone
            ports = cut(acks)
            old.set("test:after-cut", 1)
            (ticks / "stop").write_text("")
            wait_for(lambda: "exit_not_recorded job=once" in procs.logs(), 30, "the exit tried", procs)
            # And the primary dies, and the sentinels promote a replica that never saw the exit
            port = primary_port(acks)
            acks.procs["redis-0"].send_signal(signal.SIGKILL)
            acks.procs["redis-0"].wait()
        heal(acks, ports)
        until(lambda: primary_port(acks) != port, "a replica promoted", timeout=60)
        with primary(acks) as new:  # one that lacks every write the primary took after the cut
            assert new.exists("test:after-cut") == 0
        # Then the job ends SUCCEEDED in that attempt, from the exit the agent kept, and never runs again
        done = until(lambda: _ended(client, job.id), "the job ended", timeout=120)
        assert (done.state, done.attempt) == (JobState.SUCCEEDED, 1), procs.logs()
        assert len(list(ticks.glob("run-*"))) == 1
        with primary(acks) as new:
            assert new.hgetall(keys.claims) == {}  # its GPU released on the new primary too
    finally:
        procs.stop()
        client.close()


def _done(call: Callable[[], object]) -> bool:
    try:
        call()
    except (StoreUnavailable, NotFound):
        return False
    return True


def _ended(client: DirectClient, job_id: str) -> Job | None:
    try:
        job = client.get(job_id)
    except StoreUnavailable:
        return None
    return job if job.state.final else None
