"""The failover test's parts: a Redis primary, two replicas and three sentinels behind forwarders it
can cut (:mod:`tests.chaos.proxy`), the faults (a SIGKILLed primary, a partitioned one), the load
(users' scripts submitting and cancelling through the API, retrying as a user's script would, every
call logged), and what the checker reads back (:mod:`tests.chaos.checker`).
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.procs import DirectClient
from fleet import JobSpec
from fleet.client import Client
from fleet.errors import FleetError, StoreUnavailable
from fleet.models import JobState
from fleet.ops import redis_local
from fleet.ops.redis_local import LocalRedis
from tests.chaos.checker import History, Run
from tests.chaos.proxy import Forwarders

# A job that checkpoints every second and resumes from its latest checkpoint, recording its own run
# in OUT/<job>.<attempt>.<pid>: its node and GPUs, then the time of its start and of each step, then
# "finished" if it did the last step. SIGTERM (a cancel, a fence) makes it checkpoint and leave.
JOB = """
import json, os, pathlib, time
import fleet_worker as fw
stop = fw.stop_requested()
steps = int(os.environ["STEPS"])
# the process runtime runs an attempt in <state_dir>/attempts/<job>.<attempt>/work, a node's own state_dir
node = pathlib.Path.cwd().parents[2].name
gpus = os.environ["CUDA_VISIBLE_DEVICES"]
record = open(os.path.join(os.environ["OUT"], f"{fw.job_id()}.{fw.attempt()}.{os.getpid()}"), "a")
record.write(json.dumps({"node": node, "gpus": gpus.split(",") if gpus else []}) + "\\n")
record.write(f"{time.time()}\\n"); record.flush()
resumed = fw.load_latest()
start = resumed[1] if resumed else 0
for step in range(start, steps):
    time.sleep(0.25)
    record.write(f"{time.time()}\\n"); record.flush()
    if (step + 1) % 4 == 0 or step + 1 == steps or stop.is_set():
        fw.save({"step": step + 1}, step + 1)
    if stop.is_set() and step + 1 < steps:
        fw.exit_after_checkpoint()
if start < steps:
    record.write("finished\\n")
"""
#: a job's steps last this long (s)
STEP_S = 0.25
#: a user's script gives up a call it could not get acknowledged for this long (s)
GIVE_UP_S = 120
#: what a call's try may end in once acknowledged (the job's id, or its cancel, took effect)
ACKNOWLEDGED = ("ok", "cancelled", "final")


@dataclass
class Fault:
    """One failover: what was done to which Redis, when, and when a replica was named primary."""

    kind: str  # "kill" or "partition"
    victim: str
    at: float
    promoted: float = 0.0


class Cluster:
    """A primary, two replicas and three sentinels (as ``fleet up --ha``), each Redis behind a
    forwarder: the address every other part knows it by, which :meth:`partition` cuts."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.forwarders = folder, Forwarders()
        self.fronts: list[int] = []  # redis-N's forwarder port
        self._argv: dict[int, tuple[list[str], str | None]] = {}  # pid -> how it was started
        self.ha: LocalRedis = redis_local.start(folder, self._spawn, ha=True, front=self._front)

    def _front(self, port: int) -> int:
        self.fronts.append(self.forwarders.front(port))
        return self.fronts[-1]

    def _spawn(self, name: str, argv: list[str], stdin: str | None, umask: int) -> subprocess.Popen[bytes]:
        with open(self.folder.parent / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, umask=umask
            )
        assert proc.stdin is not None
        proc.stdin.write((stdin or "").encode())
        proc.stdin.close()
        self._argv[proc.pid] = (argv, stdin)
        return proc

    def primary(self) -> str:
        """The Redis a majority of the sentinels name primary ("" while they disagree or are down)."""
        named = []
        password = self._password(self.ha.sentinel_password_file)
        for address in self.ha.sentinels:
            try:
                with redis.Redis(
                    port=int(address.rpartition(":")[2]), password=password, socket_timeout=1
                ) as s:
                    named.append(int(s.sentinel_get_master_addr_by_name(redis_local.MASTER)[1]))
            except redis.RedisError:
                continue
        port = max(set(named), key=named.count, default=0)
        return f"redis-{self.fronts.index(port)}" if named.count(port) >= 2 else ""

    def kill(self) -> Fault:
        """SIGKILL the primary; once a replica is promoted, start it again as it was (systemd's
        ``Restart=``), for the sentinels to make a replica of."""
        victim = self.primary()
        fault = Fault("kill", victim, time.time())
        self.ha.procs[victim].send_signal(signal.SIGKILL)
        self.ha.procs[victim].wait()
        fault.promoted = self._promoted(victim)
        argv, stdin = self._argv[self.ha.procs[victim].pid]
        self.ha.procs[victim] = self._spawn("redis", argv, stdin, 0o077)
        return fault

    def partition(self, hold_s: float) -> Fault:
        """Cut the primary off from everyone; ``hold_s`` after a replica is promoted, heal it."""
        victim = self.primary()
        front = self.fronts[int(victim[-1])]
        fault = Fault("partition", victim, time.time())
        self.forwarders.cut(front)
        try:
            fault.promoted = self._promoted(victim)
            time.sleep(hold_s)
        finally:
            self.forwarders.heal(front)
        return fault

    def settled(self, timeout: float = 60) -> None:
        """Until the sentinels agree on a primary that has both replicas online (the next fault
        needs a replica holding every acknowledged write)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            primary = self.primary()
            if primary:
                try:
                    info = self._replication(primary)
                    online = [info.get(f"slave{n}", {}).get("state") for n in range(redis_local.REPLICAS)]
                    if info["role"] == "master" and online == ["online"] * redis_local.REPLICAS:
                        return
                except redis.RedisError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"the Redis set did not settle in {timeout:g} s")

    def role(self, name: str) -> str:
        """What Redis ``name`` says it is ("master" or "slave")."""
        return str(self._replication(name)["role"])

    def client(self, name: str) -> redis.Redis:
        """A client of Redis ``name`` itself (not through the sentinels), on the state DB."""
        port = self.fronts[int(name[-1])]
        password = self._password(self.ha.password_file)
        return redis.Redis(port=port, password=password, socket_timeout=5, decode_responses=True)

    def _replication(self, name: str) -> dict[str, Any]:
        with self.client(name) as r:
            return r.info("replication")  # type: ignore[return-value]

    def _promoted(self, victim: str, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while self.primary() in ("", victim):
            assert time.monotonic() < deadline, f"no replica promoted in {timeout:g} s after {victim}'s loss"
            time.sleep(0.05)
        return time.time()

    @staticmethod
    def _password(path: Path | None) -> str | None:
        return path.read_text().strip() if path else None

    def close(self) -> None:
        for proc in self.ha.procs.values():
            proc.kill()
            proc.wait()
        self.forwarders.close()


@dataclass(frozen=True)
class Call:
    """One try of a user's call: what, from when to when, and how it ended ("ok", "cancelled"
    (acknowledged and took effect or will), "final" (acknowledged, the job had ended), or the error)."""

    user: str
    op: str
    job_id: str
    began: float
    ended: float
    outcome: str


@dataclass
class Load:
    """Users' scripts: each submits jobs through the API with its own job ids, now and then cancels
    one of its GPU jobs, and retries a call the API could not complete (503, a connection lost) until it
    is acknowledged, as a user's script would. Every try is logged."""

    client: Client
    out: Path
    rng: random.Random
    job_s: tuple[float, float]
    users: int = 3
    pause_s: float = 1.5  # mean pause between a user's calls
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for n in range(self.users):
            seed = self.rng.random()
            self._threads.append(threading.Thread(target=self._user, args=(f"u{n}", random.Random(seed))))
            self._threads[-1].start()

    def stop(self) -> None:
        """Stop making new calls; return once the calls under way were acknowledged."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)

    def _user(self, name: str, rng: random.Random) -> None:
        try:
            self._calls(name, rng)
        finally:
            self.client.close()  # this thread's connection

    def _calls(self, name: str, rng: random.Random) -> None:
        mine: list[str] = []  # this user's GPU jobs: long enough to be cancelled before they end
        for n in itertools.count():
            if self._stop.wait(rng.expovariate(1 / self.pause_s)):
                return
            if mine and rng.random() < 0.15:
                self._call(name, "cancel", mine.pop(rng.randrange(len(mine))), self._cancel)
                continue
            spec = self._spec(rng)
            acked = self._call(name, "submit", f"{name}-{n}", functools.partial(self._submit, spec=spec))
            if acked and spec.gpus:
                mine.append(f"{name}-{n}")

    def _spec(self, rng: random.Random) -> JobSpec:
        """A GPU job of 1 or 2 GPUs one time in three, else a short one of CPUs only (many, placed at
        once while the GPUs are busy, so each failover's recovery shows in seconds)."""
        gpus, seconds = (rng.choice((1, 2)), rng.uniform(*self.job_s)) if rng.random() < 1 / 3 else (0, 0.5)
        steps = max(1, round(seconds / STEP_S))
        env = {"OUT": str(self.out), "STEPS": str(steps)}
        return JobSpec.parse(
            {"name": "failover", "command": [sys.executable, "-c", JOB], "env": env, "gpus": gpus}
        )

    def _submit(self, job_id: str, spec: JobSpec) -> str:
        self.client.submit(spec, job_id=job_id)
        return "ok"

    def _cancel(self, job_id: str) -> str:
        job = self.client.cancel(job_id)
        return "cancelled" if job.state == JobState.CANCELLED or job.cancel_requested else "final"

    def _call(self, user: str, op: str, job_id: str, call: Callable[[str], str]) -> bool:
        """Try ``call`` until acknowledged (retrying what a user's script retries, for up to
        ``GIVE_UP_S``); whether it was. A call refused or given up is logged as such."""
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            began = time.time()
            try:
                outcome = call(job_id)
            except StoreUnavailable as exc:  # 503s (not replicated, Redis unavailable), the API unreachable
                outcome = f"{type(exc).__name__}: {exc}"
            except FleetError as exc:  # a user's script would not retry it: neither do we
                outcome = f"refused {type(exc).__name__}: {exc}"
            self._log(Call(user, op, job_id, began, time.time(), outcome))
            if outcome in ACKNOWLEDGED:
                return True
            if outcome.startswith("refused") or time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def failed(self) -> list[Call]:
        """The calls refused, or never acknowledged however long they were retried (their last try)."""
        last = {(c.op, c.job_id): c for c in self.calls}
        return [c for c in last.values() if c.outcome not in ACKNOWLEDGED]

    def _log(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def acknowledged(self, op: str, outcomes: tuple[str, ...] = ("ok", "cancelled")) -> set[str]:
        return {c.job_id for c in self.calls if c.op == op and c.outcome in outcomes}


def runs(out: Path) -> Iterator[Run]:
    """The runs the jobs recorded (a run killed before its first tick recorded none)."""
    for path in out.iterdir():
        job_id, attempt, _pid = path.name.rsplit(".", 2)
        head, *lines = path.read_text().splitlines()
        ticks = [float(line) for line in lines if line != "finished"]
        where = json.loads(head)
        if ticks:
            yield Run(
                job_id,
                int(attempt),
                where["node"],
                tuple(where["gpus"]),
                ticks[0],
                ticks[-1],
                "finished" in lines,
            )


def history(direct: DirectClient, load: Load, out: Path) -> History:
    """What the users were told, what the jobs recorded and what the fleet holds now."""
    return History(
        submitted=load.acknowledged("submit"),
        cancelled=load.acknowledged("cancel", ("cancelled",)),
        final={job.id: job.state.value for job in direct.jobs(limit=100_000)},
        runs=list(runs(out)),
        claims={gpu: holder for node in direct.nodes() for gpu, holder in node.claims.items()},
    )


def recovery(faults: list[Fault], calls: list[Call], placed: list[float]) -> list[dict[str, Any]]:
    """Per failover: seconds from the fault to the promotion, to the first submit acknowledged by a
    try begun after it, and to the first placement after it (None: none before the next fault)."""
    report = []
    for n, fault in enumerate(faults):
        until = faults[n + 1].at if n + 1 < len(faults) else float("inf")
        acked = [
            c.ended for c in calls if c.op == "submit" and c.outcome == "ok" and fault.at < c.began < until
        ]
        after = [at for at in placed if fault.at < at < until]
        report.append(
            {
                "fault": fault.kind,
                "victim": fault.victim,
                "promoted_s": round(fault.promoted - fault.at, 2),
                "first_submit_s": round(min(acked) - fault.at, 2) if acked else None,
                "placements_s": round(min(after) - fault.at, 2) if after else None,
            }
        )
    return report


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None
