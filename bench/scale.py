"""Scale: the real controller against many simulated nodes and a deep queue; one real agent's throughput.

Everything runs as separate processes on one machine and one ``redis-server``: the controller
(``bench/controller.py``: the real one, which also writes each scheduling pass's duration), the
node simulator (``bench/nodesim.py``), and this driver. Scenarios:

0. **The simulator's own cost.** ``--nodes`` idle simulated nodes for 10 s, with the shared
   consumer and with one dramatiq Worker on every node queue: its CPU, Redis's, script calls/s.
1. **Passes.** ``--nodes`` simulated nodes of 8 GPUs (half "A100", half "H100") and ``--queued``
   jobs of mixed shapes (1/2/4/8 GPUs, and ``--gang-fraction``, default 5 %, of multi-node jobs of
   2-4 nodes x 8 GPUs; 40 % bound to a GPU model) that run for a day, stored before the controller
   starts. Reported: the first pass (it places what fits), the time until
   every placed job runs, then the median and p99 of the passes that follow while nothing changes.
2. **Idle CPU.** The controller's CPU over one ``resync_interval_s`` in that state (psutil: it
   holds one full reconcile and one queue resync), the simulator's and Redis's beside it.
3. **Where the time goes.** ``py-spy record`` on the controller for ``--profile-s`` seconds,
   summarised by function (inclusive and self share of the samples).
4. **A high-priority job into the deep queue.** One extra node ("L4") keeps GPUs free: one job
   bound to it runs for a day and an 8-GPU job that asks for it waits ahead of the whole queue,
   so the scheduler reserves the node for it and nothing in the queue may use the free GPUs. A job
   of priority 1000 asking for one L4 GPU is submitted; timed from ``submit()`` to its RUNNING
   (``started_at``), ``--probes`` times.
5. **Throughput with one real agent.** Fresh controller (``fleet controller``) and agent
   (``fleet agent``: process runtime, 16 simulated GPUs), default settings; ``--jobs`` jobs of
   ``true`` submitted at once; first submit -> last SUCCEEDED. ``bash bench/slurm.sh`` runs the
   same with Slurm.
6. **Churn** (``--churn-s S``): queued jobs run S/2 to 3S/2 seconds, so once the first placed
   ones end, jobs end and queued ones take their GPUs all the time; passes are timed over
   ``--window`` seconds of that (it runs after scenario 4).

Every wait has a deadline (``--timeout`` s each): what does not finish is reported as such. A
controller whose pass outlasts its leader lease has its writes fenced off and places nothing; the
run says so, and ``--leader-lease-s`` lengthens the lease to measure the passes anyway.
Run: ``python -m bench.scale`` (small), ``python -m bench.scale --nodes 1000 --queued 100000``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from bench.dispatch import machine_line, redis_server
from bench.harness import (
    Result,
    Services,
    cpu_over,
    cpu_seconds,
    passes,
    pythonpath,
    quantile,
    redis_pid,
    until,
)
from bench.procs import FleetProcs, job_root
from bench.profile import summarise
from bench.simfleet import SECONDS_LABEL
from fleet.api.backend import Backend
from fleet.bus import CONTROLLER_QUEUE, Bus, JobSubmitted
from fleet.config import Settings, load_settings
from fleet.keys import Keys
from fleet.models import JobSpec, JobState
from fleet.state import JobStore, connect

DAY = "86400"
PROBE_MODEL = "L4"


def redis_counts(url: str) -> tuple[int, int]:
    """(all commands, including those run inside Lua scripts; script calls, i.e. client round trips)."""
    r = redis.Redis.from_url(url)
    stats = r.info("commandstats")
    scripts = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    total = int(r.info("stats")["total_commands_processed"])
    r.close()
    return total, scripts


def backlog(
    count: int, churn_s: float = 0, seed: int = 1, gang_fraction: float = 0.0
) -> Iterator[tuple[str, JobSpec]]:
    """Mixed shapes: 1/2/4/8 GPUs (4:3:2:1), 20 % asking for "A100", 20 % for "H100"; a day long,
    or with ``churn_s`` between half and one and a half times that. A ``gang_fraction`` of them are
    multi-node jobs of 2 to 4 nodes x 8 GPUs, drawn apart: the other jobs keep the shapes they have
    without gangs (``--gang-fraction 0`` is the queue of earlier runs)."""
    rng, gangs = random.Random(seed), random.Random(seed + 1)
    for i in range(count):
        gpus = rng.choice([1, 1, 1, 1, 2, 2, 2, 4, 4, 8])
        model = rng.choice([None, None, None, "A100", "H100"])
        seconds = str(round(rng.uniform(churn_s / 2, churn_s * 1.5))) if churn_s else DAY
        nodes = gangs.choice([2, 3, 4]) if gangs.random() < gang_fraction else None
        shape = {"nodes": nodes, "gpus_per_node": 8} if nodes else {"gpus": gpus}
        yield (
            f"q-{i}",
            JobSpec.parse({"name": "q", "command": ["sleep", seconds], "gpu_model": model, **shape}),
        )


def probe_setup() -> list[tuple[str, JobSpec]]:
    """One L4 GPU busy for a day, and an 8-GPU L4 job ranked above the queue that can never fit:
    the scheduler reserves the L4 node for it, so its 7 free GPUs stay free for the probes."""
    filler = JobSpec(name="l4-filler", command=["sleep", DAY], gpus=1, gpu_model=PROBE_MODEL, priority=2)
    holder = JobSpec(name="l4-holder", command=["sleep", DAY], gpus=8, gpu_model=PROBE_MODEL, priority=1)
    return [("l4-filler", filler), ("l4-holder", holder)]


def bulk_create(settings: Settings, jobs: Iterator[tuple[str, JobSpec]], chunk: int = 2000) -> int:
    """Store QUEUED jobs exactly as ``JobStore.create`` does (its script, its keys), a chunk per round
    trip, then wake the controller once: a client submitting 100,000 jobs one by one takes minutes."""
    client = connect(settings)
    store, count = JobStore(client, Keys(settings.key_prefix)), 0
    while batch := list(itertools.islice(jobs, chunk)):
        count += store.create_many(batch, time.time()).count(1)
    bus = Bus(settings)
    bus.send(CONTROLLER_QUEUE, JobSubmitted(job_id="bulk"))
    bus.close()
    client.close()
    return count


# -- scenarios 1-4 ------------------------------------------------------------------------


class ScaleRun:
    def __init__(self, args: argparse.Namespace, url: str, root: Path, out: Result) -> None:
        self.args, self.url, self.root, self.out = args, url, root, out
        self.env = {
            **os.environ,
            "FLEET_REDIS_URL": url,
            "FLEET_CONTROLLER__METRICS_PORT": "0",
            "FLEET_AGENT__METRICS_PORT": "0",
            "PYTHONPATH": pythonpath(),
        }
        if args.leader_lease_s:
            self.env["FLEET_CONTROLLER__LEADER_LEASE_S"] = str(args.leader_lease_s)
        self.settings = load_settings(redis_url=url)
        if args.leader_lease_s:
            self.settings.controller.leader_lease_s = args.leader_lease_s
        self.store = JobStore(connect(self.settings), Keys(self.settings.key_prefix))
        self.services = Services(root, self.env)
        self.tap = root / "passes.jsonl"
        #: jobs RUNNING at the last look (see settled)
        self._running = -1

    def run(self) -> None:
        self.store.redis.flushall()
        try:
            if not self.start_nodes():
                return
            self.load_queue()
            settled = self.start_controller()
            self.steady_passes(settled)
            self.idle_cpu(settled)
            self.profile()
            self.probes(settled)
            self.churn(settled)
        finally:
            self.services.stop()

    def sim_stats(self) -> dict[str, Any]:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return dict(json.loads((self.root / "sim.json").read_text()))
        return {}

    def start_nodes(self) -> bool:
        half = self.args.nodes // 2
        groups = [
            f"{self.args.nodes - half}:8:Sim A100 80GB:a100",
            f"{half}:8:Sim H100 80GB:h100",
            f"1:8:Sim {PROBE_MODEL} 24GB:l4",
        ]
        argv = [f"--group={g}" for g in groups if not g.startswith("0:")]
        self.services.start("nodesim", "bench.nodesim", *argv, f"--stats={self.root / 'sim.json'}")
        started = time.monotonic()
        if not until(lambda: self.sim_stats().get("joined", 0) >= self.args.nodes + 1, self.args.timeout):
            self.out.add("simulated nodes up", f"did not finish in {self.args.timeout:.0f} s")
            return False
        stats = self.sim_stats()
        self.out.add(
            "simulated nodes up",
            f"{time.monotonic() - started:.1f} s",
            f"{stats['nodes']} nodes, {stats['gpus']} GPUs; heartbeat round "
            f"{stats['heartbeat_last_ms']} ms for all nodes",
        )
        return True

    def load_queue(self) -> None:
        started = time.monotonic()
        stored = bulk_create(self.settings, iter(probe_setup()))
        stored += bulk_create(
            self.settings, backlog(self.args.queued, self.args.churn_s, gang_fraction=self.args.gang_fraction)
        )
        self.out.add("queue stored", f"{stored} jobs", f"in {time.monotonic() - started:.1f} s (pipelined)")

    def start_controller(self) -> float | None:
        """Start the controller; the wall time once every placed job runs, or None."""
        started = time.time()
        self.services.start("controller", "bench.controller", str(self.tap))
        if not until(lambda: passes(self.tap), self.args.timeout, every=0.5):
            self.out.add(
                "first pass",
                f"did not finish in {self.args.timeout:.0f} s",
                f"{self.args.queued} queued, {self.args.nodes} nodes",
            )
            return None
        first = passes(self.tap)[0][1]
        placed = self.args.queued + 2 - self.store.count_by_state()[JobState.QUEUED]
        note = f"places {placed} jobs onto empty nodes" + self.fenced_off()
        self.out.add("first pass", f"{first:.2f} s", note, first_pass_s=first, first_pass_placed=placed)
        if not until(self.settled, self.args.timeout, every=0.5):
            self.out.add("every placed job running", f"did not finish in {self.args.timeout:.0f} s")
            return None
        if not self.placed():
            self.out.add(
                "every placed job running",
                "never: nothing placed",
                f"in {len(passes(self.tap))} passes" + self.fenced_off(),
            )
            return None
        at = time.time()
        claimed = self.store.redis.hlen(Keys(self.settings.key_prefix).claims)
        self.out.add(
            "every placed job running",
            f"{at - started:.1f} s after the controller started",
            f"{claimed} of {self.sim_stats().get('gpus')} GPUs claimed; {self.gangs()}",
            claimed_gpus=claimed,
        )
        return at

    def gangs(self) -> str:
        """How many multi-node jobs run, on how many GPUs, and the simulator's double claims."""
        running = self.store.redis.smembers(Keys(self.settings.key_prefix).jobs_in(JobState.RUNNING))
        gangs = [j for j in self.store.get_many(running) if len(j.members) > 1]
        gpus = sum(len(m.gpus) for j in gangs for m in j.members)
        conflicts = self.sim_stats().get("conflicts", "?")
        return f"{len(gangs)} multi-node jobs running on {gpus} GPUs; {conflicts} double claims"

    def placed(self) -> int:
        counts = self.store.count_by_state()
        return sum(counts[s] for s in (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING))

    def settled(self) -> bool:
        """Every placed job runs and none started since the last look (passes place in waves), or
        two passes placed nothing at all."""
        counts = self.store.count_by_state()
        if not self.placed():
            return len(passes(self.tap)) >= 2
        before, self._running = self._running, counts[JobState.RUNNING]
        return counts[JobState.SCHEDULED] + counts[JobState.STARTING] == 0 and before == self._running

    def fenced_off(self) -> str:
        """What the controller's log says about leadership lost to its own slowness, or ''."""
        lost = (self.root / "controller.log").read_text().count("leadership_lost")
        if not lost:
            return ""
        lease = self.settings.controller.leader_lease_s
        return (
            f"; leadership lost {lost} times: the lease ({lease:g} s) is renewed between passes, so a "
            "longer pass has its writes fenced off"
        )

    def steady_passes(self, settled: float | None) -> None:
        if settled is None:
            return
        window, minimum = self.args.window, self.args.min_passes

        def enough() -> bool:
            seen = [p for p in passes(self.tap) if p[0] >= settled]
            return len(seen) >= minimum and time.time() - settled >= float(window)

        finished = until(enough, self.args.timeout, every=0.5)
        seen = [s for start, s in passes(self.tap) if start >= settled]
        if not seen:
            self.out.add("pass, nothing changing", f"no pass finished in {self.args.timeout:.0f} s")
            return
        note = f"{len(seen)} passes" + (
            "" if finished else f" (wanted {minimum} in {self.args.timeout:.0f} s)"
        )
        self.out.add(
            "pass, nothing changing: median / p99",
            f"{statistics.median(seen):.3f} s / {quantile(seen, 0.99):.3f} s",
            note,
            pass_median_s=statistics.median(seen),
            pass_p99_s=quantile(seen, 0.99),
        )

    def idle_cpu(self, settled: float | None) -> None:
        pids = {name: p.pid for name, p in self.services.procs.items()}
        pids["redis"] = redis_pid(self.url)
        # over one full resync period, which holds one full reconcile and one full queue resync
        used = cpu_over(pids, self.settings.controller.resync_interval_s)
        note = ", ".join(f"{name} {pct:.0f} %" for name, pct in used.items() if name != "controller")
        if settled is None:
            note += "; the fleet never settled (above): this is the controller's steady state"
        window = f"{self.settings.controller.resync_interval_s:g} s"
        self.out.add(
            f"controller CPU, nothing changing ({window})",
            f"{used['controller']:.1f} % of a core",
            note,
            idle_cpu_percent=used,
        )

    def profile(self) -> None:
        spy = shutil.which("py-spy")
        if spy is None or self.args.profile_s <= 0:
            why = "--profile-s 0" if spy else "py-spy not installed (pip install py-spy)"
            self.out.add("where the time goes", "skipped", why)
            return
        raw = self.root / "controller.pyspy.txt"
        pid = str(self.services.procs["controller"].pid)
        subprocess.run(
            [
                spy,
                "record",
                "--pid",
                pid,
                "--duration",
                str(self.args.profile_s),
                "--rate",
                "50",
                "--nonblocking",
                "--function",
                "--format",
                "raw",
                "--output",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        if not raw.exists():
            self.out.add("where the time goes", "py-spy failed", f"see {raw}")
            return
        summary = summarise(raw.read_text())
        (self.root / "controller.profile.md").write_text(summary)
        print(summary, flush=True)
        self.out.add(
            "where the time goes", f"{self.args.profile_s} s of py-spy", "table above", profile=summary
        )

    def probes(self, settled: float | None) -> None:
        if settled is None:
            self.out.add("high-priority job -> RUNNING", "skipped", "the fleet never settled (above)")
            return
        client, waits = Backend(settings=self.settings), list[float]()
        for _ in range(self.args.probes):
            if not self._l4_free():
                self.out.add("probe", "no free L4 GPU", "the queue took the reserved node: setup is stale")
                break
            wait = self._probe(client)
            if wait is None:
                self.out.add(
                    "high-priority job -> RUNNING",
                    f"did not finish in {self.args.timeout:.0f} s",
                    f"{len(waits)} probes done before",
                )
                break
            waits.append(wait)
        client.close()
        if waits:
            self.out.add(
                "high-priority job -> RUNNING, p50 / max",
                f"{statistics.median(waits):.3f} s / {max(waits):.3f} s",
                f"{len(waits)} probes into a queue of {self.args.queued}",
                probe_s=waits,
            )

    def churn(self, settled: float | None) -> None:
        """With ``--churn-s``: passes while the first placed jobs end and queued ones take their GPUs."""
        if not self.args.churn_s or settled is None:
            return
        time.sleep(max(settled + self.args.churn_s / 2 + 5 - time.time(), 0))  # the first ends began
        ended = lambda: self.store.count_by_state()[JobState.SUCCEEDED]  # noqa: E731
        start, ended_before = time.time(), ended()
        time.sleep(self.args.window)
        took, done, low = time.time() - start, ended() - ended_before, self.args.churn_s / 2
        seen = [s for at, s in passes(self.tap) if start <= at <= start + took]
        if not seen:
            self.out.add("pass under churn", "no pass finished", f"{done} jobs ended in {took:.0f} s")
            return
        self.out.add(
            "pass under churn: median / p99",
            f"{statistics.median(seen):.3f} s / {quantile(seen, 0.99):.3f} s",
            f"{len(seen)} passes in {took:.0f} s while {done / took:.1f} jobs/s ended and as many "
            f"queued ones were placed (durations {low:g}-{low * 3:g} s)",
            churn_pass_median_s=statistics.median(seen),
            churn_pass_p99_s=quantile(seen, 0.99),
            churn_ended_per_s=done / took,
        )

    def _probe(self, client: Backend) -> float | None:
        """Seconds from ``submit()`` to RUNNING of one high-priority job, once it has ended; None: timeout."""
        spec = JobSpec(
            name="probe",
            command=["true"],
            gpus=1,
            gpu_model=PROBE_MODEL,
            priority=1000,
            labels={SECONDS_LABEL: "0"},
        )
        submitted = time.time()
        job_id = client.submit(spec).id
        if not until(lambda: client.get(job_id).started_at, self.args.timeout, every=0.05):
            return None
        started = client.get(job_id).started_at or 0.0
        until(lambda: client.get(job_id).state.final, self.args.timeout)
        return started - submitted

    def _l4_free(self) -> bool:
        claims = self.store.redis.hkeys(Keys(self.settings.key_prefix).claims)
        return sum(1 for uuid in claims if uuid.startswith("GPU-l4-")) < 8


# -- the simulator's own cost ----------------------------------------------------------------


def joined(stats: Path, nodes: int) -> bool:
    return stats.exists() and int(json.loads(stats.read_text())["joined"]) >= nodes


def sim_cost(args: argparse.Namespace, url: str, root: Path, out: Result) -> None:
    """CPU of the simulator itself (and of Redis) with ``--nodes`` idle nodes, per consumer kind."""
    env = {**os.environ, "FLEET_REDIS_URL": url, "PYTHONPATH": pythonpath()}
    for consumer in ("shared", "dramatiq"):
        connect(load_settings(redis_url=url)).flushall()
        services, stats = Services(root, env), root / f"sim-{consumer}.json"
        proc = services.start(
            f"nodesim-{consumer}",
            "bench.nodesim",
            f"--nodes={args.nodes}",
            f"--consumer={consumer}",
            f"--stats={stats}",
        )
        what = f"simulator idle, {args.nodes} nodes, {consumer} consumer"
        try:
            if not until(functools.partial(joined, stats, args.nodes), 120):
                out.add(what, "did not start in 120 s")
                continue
            time.sleep(3)
            before = redis_counts(url)[1]
            used = cpu_over({"sim": proc.pid, "redis": redis_pid(url)}, 10)
            calls = (redis_counts(url)[1] - before) / 10
            last = json.loads(stats.read_text())
            note = (
                f"Redis {used['redis']:.0f} %, {calls:.0f} script calls/s; heartbeat round for all nodes "
                f"{last['heartbeat_last_ms']} ms (max {last['heartbeat_max_ms']} ms)"
            )
            out.add(what, f"{used['sim']:.0f} % of a core", note, **{f"sim_idle_{consumer}": used})
        finally:
            services.stop()


# -- scenario 5 -----------------------------------------------------------------------------

DEFAULTS = {
    "FLEET_BUS_POLL_MS": "20",
    "FLEET_CONTROLLER__SCHEDULE_INTERVAL_S": "2",
    "FLEET_AGENT__HEARTBEAT_INTERVAL_S": "1",
    "FLEET_AGENT__NODE_LEASE_TTL_S": "10",
    "FLEET_AGENT__FENCE_MARGIN_S": "2",
    "FLEET_AGENT__RECONCILE_INTERVAL_S": "2",
    "FLEET_RETRY_BACKOFF_S": "5",
    "FLEET_CONTROLLER__LEADER_LEASE_S": "5",
}


def throughput(args: argparse.Namespace, url: str, root: Path, out: Result) -> None:
    root.mkdir(mode=0o755)
    procs = FleetProcs(url, root, "process")
    procs.env.update(DEFAULTS, PYTHONPATH=pythonpath())
    client = Backend(url)
    client._jobs.redis.flushall()
    try:
        controller, agent = procs.controller(), procs.agent("real-0", gpus=16)
        procs.wait_nodes(client, 1)
        before = {"controller": cpu_seconds(controller.pid), "agent": cpu_seconds(agent.pid)}
        spec = JobSpec(name="true", command=["true"], gpus=1)
        first = time.time()
        ids = [client.submit(spec).id for _ in range(args.jobs)]
        submitted = time.time() - first

        def done() -> bool:
            counts = client._jobs.count_by_state()
            return sum(counts[s] for s in JobState if s.final) >= len(ids)

        finished = until(done, args.timeout, every=0.1)
        jobs = client._jobs.get_many(ids)
        ok = [j for j in jobs if j.state == JobState.SUCCEEDED]
        cpu = {"controller": cpu_seconds(controller.pid), "agent": cpu_seconds(agent.pid)}
        per_job = ", ".join(f"{k} {(cpu[k] - before[k]) / max(len(ok), 1) * 1000:.0f} ms" for k in cpu)
        if not finished:
            out.add(
                f"{args.jobs} `true` jobs, one real agent",
                f"did not finish in {args.timeout:.0f} s",
                f"{len(ok)} SUCCEEDED by then",
            )
            return
        last = max(j.finished_at or 0 for j in jobs)
        out.add(
            f"{args.jobs} `true` jobs, one real agent (16 GPUs): first submit -> last SUCCEEDED",
            f"{last - first:.1f} s = {len(ids) / (last - first):.1f} jobs/s",
            f"{len(ok)} SUCCEEDED; submitting took {submitted:.1f} s; CPU per job: {per_job}",
            throughput_jobs_s=len(ids) / (last - first),
        )
    finally:
        procs.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=50, help="simulated nodes of 8 GPUs (default 50)")
    parser.add_argument("--queued", type=int, default=2000, help="jobs queued (default 2,000)")
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs for the real-agent throughput")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of steady passes to time")
    parser.add_argument(
        "--leader-lease-s", type=float, help="the controller's leader lease (default: its own)"
    )
    parser.add_argument("--min-passes", type=int, default=5, help="steady passes to time, at least")
    parser.add_argument("--profile-s", type=int, default=20, help="py-spy seconds (0: skip)")
    parser.add_argument(
        "--churn-s",
        type=float,
        default=0,
        help="queued jobs run 0.5-1.5x this long, and passes are also timed while they end (0: a day)",
    )
    parser.add_argument(
        "--gang-fraction",
        type=float,
        default=0.05,
        help="share of queued jobs that are multi-node: 2-4 nodes x 8 GPUs (default 0.05; 0: none)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of each wait, in seconds")
    parser.add_argument("--skip", action="append", default=[], choices=["sim", "scale", "throughput"])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    root = job_root("fleet-bench-scale-")
    out = Result()
    print(
        machine_line("scale") + f"; --nodes {args.nodes} --queued {args.queued} "
        f"--gang-fraction {args.gang_fraction:g}; logs in {root}"
    )
    print("| what | result | notes |\n|---|---|---|", flush=True)
    with redis_server() as url:
        if "sim" not in args.skip:
            sim_cost(args, url, root, out)
        if "scale" not in args.skip:
            (root / "scale").mkdir()
            ScaleRun(args, url, root / "scale", out).run()
        if "throughput" not in args.skip:
            throughput(args, url, root / "throughput", out)
    if args.json:
        args.json.write_text(json.dumps({"rows": out.rows, **out.data}, indent=1))


if __name__ == "__main__":
    main()
