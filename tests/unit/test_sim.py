"""``fleet sim``: answers worked out by hand on tiny traces, gangs, determinism, fair share and
preemption, the elastic policies, and the command itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.scheduler.profiles import named_profile
from fleet.scheduler.sizing import fit_batch
from fleet.sim import SimConfig, Simulation, read_trace, run
from fleet.sim.traces import TraceJob

PHILLY = "timestamp,duration,num_gpus,gpu_time,cluster\n"

#: a command's environment with nothing of the caller's but where fleet is (and, under `make
#: coverage`, coverage's own setting, so what the command runs is measured too)
BARE = {
    "PATH": "/usr/bin:/bin",
    "PYTHONPATH": str(Path(__file__).parents[2]),
    **{k: v for k, v in os.environ.items() if k.startswith("COVERAGE_PROCESS_")},
}


def philly(tmp_path: Path, rows: list[tuple[int, float, int, str]]) -> Path:
    """A trace in the Philly format: (seconds from the start, duration, GPUs, tenant) each."""
    path = tmp_path / "trace.csv"
    lines = [f"2017-10-01 00:{t // 60:02d}:{t % 60:02d},{d},{g},{d * g},{c}" for t, d, g, c in rows]
    path.write_text(PHILLY + "\n".join(lines) + "\n")
    return path


def test_two_jobs_on_four_gpus_complete_when_worked_out_by_hand(tmp_path: Path) -> None:
    # a: 4 GPUs for 100 s from t=0; b: 2 GPUs for 50 s from t=10, waits for a's GPUs
    trace = philly(tmp_path, [(0, 100, 4, "x"), (10, 50, 2, "y")])
    r = run(trace, "fifo", gpus=4)
    assert (r.completed, r.makespan) == (2, 150.0)
    assert r.jct.mean == pytest.approx((100 + 140) / 2) and r.jct.max == 140.0
    assert r.queueing.mean == pytest.approx(90 / 2)
    assert r.completed_by == {"1h": 2}
    assert r.utilisation == pytest.approx((4 * 100 + 2 * 50) / (4 * 150))
    assert r.tenant_share == pytest.approx({"x": 0.8, "y": 0.2})
    # with 6 GPUs on 3 nodes both run at once
    r = run(trace, "fifo", gpus=6, nodes=3)
    assert r.jct.mean == pytest.approx((100 + 50) / 2) and r.queueing.max == 0.0


def test_a_workload_job_runs_its_epochs_at_the_profiles_throughput() -> None:
    job = TraceJob("c", "t", 0.0, gpus=4, batch=512, model="cifar10")
    r = Simulation([job], SimConfig("fifo", gpus=8, model="throughput")).run()
    cifar = named_profile("cifar10")
    assert r.jct.mean == pytest.approx(cifar.samples / cifar.throughput(4, 512))


def test_a_gang_spans_nodes_and_waits_for_whole_nodes(tmp_path: Path) -> None:
    # 2 nodes x 4 GPUs; a 1-GPU job holds part of one node, so an 8-GPU gang (2 x 4) waits for it
    trace = philly(tmp_path, [(0, 100, 1, "x"), (1, 60, 8, "x"), (2, 30, 3, "x")])
    sim = Simulation(read_trace(trace), SimConfig("fifo", gpus=8, nodes=2))
    seen = []
    original = sim._take

    def take(job, members):  # type: ignore[no-untyped-def]
        seen.append((job.id, sorted((p.node, len(p.gpus)) for p in members)))
        original(job, members)

    sim._take = take  # type: ignore[method-assign]
    r = sim.run()
    # the gang reserves both nodes, so the 3-GPU job behind it does not take them (it would
    # starve the gang); the gang runs on both nodes when the first job ends, then the 3-GPU job
    assert seen == [("p0", [("n000", 1)]), ("p1", [("n000", 4), ("n001", 4)]), ("p2", [("n000", 3)])]
    assert r.completed == 3 and r.makespan == pytest.approx(100 + 60 + 30)


def test_the_same_trace_gives_the_same_answer() -> None:
    a = run("workload-2", "elastic", limit=40, load=2).to_dict()
    b = run("workload-2", "elastic", limit=40, load=2).to_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b and a["resizes"] > 0


def test_a_sustained_load_repeats_the_trace_at_its_rate_within_its_span(tmp_path: Path) -> None:
    # arrivals at 0, 60, 120 s: at 2x they come at 0, 30, 60 s, and then again at 60, 90, 120 s
    trace = philly(tmp_path, [(0, 10, 1, "x"), (60, 10, 1, "x"), (120, 10, 1, "x")])
    jobs = read_trace(trace, 2.0, sustain=True)
    assert [(j.id, j.arrival) for j in jobs] == [
        ("p0", 0.0),
        ("p1", 30.0),
        ("p2", 60.0),
        ("p0#1", 60.0),
        ("p1#1", 90.0),
        ("p2#1", 120.0),
    ]
    assert [j.arrival for j in read_trace(trace, 2.0)] == [0.0, 30.0, 60.0]  # compressed only
    # 1.5x: copies every 80 s, the second one cut at the trace's 120 s
    assert [j.arrival for j in read_trace(trace, 1.5, sustain=True)] == [0.0, 40.0, 80.0, 80.0, 120.0]
    result = run(trace, "fifo", gpus=1, load=2.0, sustain=True)
    assert (result.jobs, result.completed, result.sustained) == (6, 6, True)


def test_until_stops_the_clock_and_counts_what_never_started(tmp_path: Path) -> None:
    trace = philly(tmp_path, [(0, 100, 4, "x"), (10, 50, 4, "x"), (20, 50, 4, "x")])
    r = run(trace, "fifo", gpus=4, until=120)
    assert (r.completed, r.never_started, r.end) == (1, 1, 120.0)


def test_fair_share_gives_gpu_time_by_weight(tmp_path: Path) -> None:
    # two tenants, each with more 1-GPU work than the 4 GPUs can run; weights 3:1
    rows = [(0, 600, 1, t) for _ in range(40) for t in ("a", "b")]
    trace = philly(tmp_path, rows)
    r = run(trace, "fair", gpus=4, weights={"a": 3, "b": 1}, until=6000)
    assert r.tenant_share["a"] == pytest.approx(0.75, abs=0.05)
    r = run(trace, "fifo", gpus=4, until=6000)  # submission order: a, b, a, b, ...
    assert r.tenant_share["a"] == pytest.approx(0.5, abs=0.05)


def test_a_tenant_below_its_guarantee_preempts(tmp_path: Path) -> None:
    # a fills the 4 GPUs with long jobs; b, guaranteed 2 GPUs, arrives after a's min_run_s (600 s)
    rows = [(0, 5000, 1, "a") for _ in range(4)] + [(0, 5000, 1, "a"), (700, 100, 2, "b")]
    from fleet.models import Tenant

    trace = philly(tmp_path, rows)
    r = run(trace, "fair", gpus=4, tenants={"b": Tenant(name="b", guaranteed_gpus=2)})
    assert r.preemptions == 2
    guarantee = {"b": Tenant(name="b", guaranteed_gpus=2)}
    sim = Simulation(read_trace(trace), SimConfig("fair", gpus=4, tenants=guarantee))
    sim.run()
    b = sim.jobs["p5"]
    assert b.started == 700.0 and b.ended == 800.0


def test_elastic_beats_its_fixed_batch_baseline_on_a_busy_workload() -> None:
    fixed = run("workload-3", "elastic-fixed-batch", limit=60, load=2)
    elastic = run("workload-3", "elastic", limit=60, load=2)
    assert elastic.completed == fixed.completed == 60
    assert elastic.jct.mean is not None and fixed.jct.mean is not None
    assert elastic.jct.mean < fixed.jct.mean / 1.8
    assert elastic.resizes > 0 and elastic.utilisation > 0.5


def test_a_lone_elastic_job_starts_at_its_fastest_size() -> None:
    job = TraceJob("c", "t", 0.0, gpus=4, batch=512, model="cifar10")
    sim = Simulation([job], SimConfig("elastic", gpus=64, model="throughput"))
    r = sim.run()
    cifar = named_profile("cifar10")
    _, batch, gpus = max((*cifar.best(g), g) for g in range(1, 65) if g <= 4 or g % 4 == 0)  # whole nodes
    batch = fit_batch(batch, gpus, cifar.min_batch, cifar.max_batch)  # beyond one; an even split, as live
    assert r.jct.mean == pytest.approx(cifar.samples / cifar.throughput(gpus, batch)) and r.resizes == 0
    assert sim.decisions == [(0.0, "placed", "c", gpus), (r.jct.mean, "ended", "c", 0)]


def test_a_lone_learning_job_starts_at_one_gpu_and_doubles_as_it_learns() -> None:
    job = TraceJob("c", "t", 0.0, gpus=4, batch=512, model="cifar10")
    config = SimConfig(
        "elastic",
        gpus=64,
        learn=True,
        learn_max_local=False,
        resize_cost_s=30,
        min_interval_s=120,
        model="throughput",
    )
    sim = Simulation([job], config)
    r = sim.run()
    # nothing known at first: 1 GPU at the smallest batch; each size it ran at lets it try twice the
    # GPUs (at the same batch per GPU), one resize per minimum interval while that pays. 8 GPUs, its
    # first across nodes, ran slower than 4 on one node; it still tries 16, which it expects to
    # synchronise as 8 did (across nodes learned apart from within one), and there it runs faster
    seen = sorted(sim.jobs["c"].observed)
    assert seen[:5] == [(1, 128), (2, 256), (4, 512), (8, 1024), (16, 2048)] and r.resizes >= 4
    observed = sim.jobs["c"].observed
    assert observed[8, 1024] < observed[4, 512] < observed[16, 2048]
    assert r.completed == 1 and r.jct.mean is not None
    assert r.jct.mean > Simulation([job], replace(config, learn=False)).run().jct.mean  # type: ignore[operator]
    # declaring the largest per-GPU batch that fits one GPU (cifar10's: 1024) lets it go there once it
    # has run at the batch it was tuned at
    declared = Simulation([job], replace(config, learn_max_local=True))
    faster = declared.run()
    assert sorted(declared.jobs["c"].observed)[:2] == [(1, 128), (2, 2048)]
    assert faster.completed == 1


def test_bad_input_is_refused_with_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a trace fleet reads"):
        run(bad)
    with pytest.raises(ValueError, match="unknown policy"):
        run("workload-1", "sjf", limit=2)
    with pytest.raises(ValueError, match="evenly"):
        run("workload-1", gpus=10, nodes=4, limit=2)


def test_the_command_line_builds_without_importing_the_simulator() -> None:
    from fleet.cli import sim
    from fleet.sim import POLICIES

    assert sim.POLICIES == POLICIES
    help_ = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fleet", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "sim" in help_.stdout and "| numpy" not in help_.stderr  # every command's help, no simulator


def test_fleet_sim_runs_as_a_command_without_any_service(tmp_path: Path) -> None:
    trace = philly(tmp_path, [(0, 100, 4, "x"), (10, 50, 2, "y")])
    out = subprocess.run(
        [sys.executable, "-m", "fleet", "sim", str(trace), "--gpus", "4", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=BARE,
    )
    data = json.loads(out.stdout)
    assert (data["completed"], data["makespan"], data["jct"]["mean"]) == (2, 150.0, 120.0)
    table = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet",
            "sim",
            "workload-1",
            "--policy",
            "elastic",
            "--limit",
            "10",
            "--plot",
            str(tmp_path / "p.png"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=BARE,
    )
    assert "JCT avg / median / p99" in table.stdout and (tmp_path / "p.png").stat().st_size > 10_000
    refused = subprocess.run(
        [sys.executable, "-m", "fleet", "sim", "nope.csv"],
        capture_output=True,
        text=True,
        timeout=60,
        env=BARE,
    )
    assert refused.returncode == 2 and "workload-1" in refused.stderr


def test_fleet_sim_takes_tenants_weights_and_guarantees_and_names_a_bad_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet.cli.main import main

    # a fills 4 GPUs with long jobs; b, guaranteed 2 GPUs, arrives after a's min_run_s (600 s)
    rows = [(0, 5000, 1, "a") for _ in range(5)] + [(700, 100, 2, "b")]
    trace = str(philly(tmp_path, rows))
    fair = ["sim", trace, "--gpus", "4", "--policy", "fair", "-o", "json"]
    assert main([*fair, "--weight", "a=2", "--guarantee", "b=2"]) == 0
    guaranteed = json.loads(capsys.readouterr().out)
    assert main(fair) == 0
    plain = json.loads(capsys.readouterr().out)
    assert guaranteed["completed"] == plain["completed"] == 6
    # b's guarantee preempts two of a's jobs; without it, b waits for a's to end
    assert (guaranteed["preemptions"], plain["preemptions"]) == (2, 0)
    for bad, named in [
        (["--weight", "a=two"], "--weight a='two': use TENANT=NUMBER"),
        (["--guarantee", "b"], "--guarantee"),
        (["--until", "soon"], "--until:"),
    ]:
        assert main([*fair, *bad]) == 2
        assert named in capsys.readouterr().err


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_the_figures_of_a_run_and_of_policies_side_by_side_are_drawn(tmp_path: Path) -> None:
    from fleet.sim.plot import TOP_TENANTS, compare, plot

    # a run of more tenants than a share plot draws apart (the rest are summed as "others")
    rows = [(10 * i, 300, 1, f"t{i}") for i in range(TOP_TENANTS + 2)]
    trace = philly(tmp_path, rows)
    fifo, fair = run(trace, "fifo", gpus=4), run(trace, "fair", gpus=4)
    assert len(fair.tenant_share) == TOP_TENANTS + 2
    assert _png_size(plot(fair, tmp_path / "run.png")) == (900, 855)  # 10 x 9.5 in at 90 dpi
    side = compare({"fifo": [fifo], "fair": [fair]}, tmp_path / "side.png", "two policies")
    assert _png_size(side) == (880, 336)  # 11 x 4.2 in at 80 dpi
