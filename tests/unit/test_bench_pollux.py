"""``bench/pollux.py``: fleet's elastic step inside Pollux's own simulator, on a few jobs of a workload.

The adapter must finish every job, count the restarts fleet's resizes cost, and hand fleet only what a
live scheduler knows: no job's remaining work, and throughput only at sizes the job ran at."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas
import pytest

from bench import pollux
from fleet.scheduler.learned import LearnedProfile
from fleet.scheduler.resizing import Elastic, Resize

#: short jobs of the artifact's models (cifar10 takes about 1,000 s, ncf about 100 s under Tiresias),
#: arriving while the others run; the last two columns are what Tiresias runs them at
WORKLOAD = pandas.DataFrame(
    [
        ("cifar10-0", 0, "cifar10", 4, 512),
        ("ncf-1", 30, "ncf", 1, 256),
        ("cifar10-2", 200, "cifar10", 2, 256),
        ("ncf-3", 400, "ncf", 1, 512),
    ],
    columns=["name", "time", "application", "num_replicas", "batch_size"],
)


def test_fleet_and_tiresias_finish_a_short_workload_in_pollux_simulator() -> None:
    fleet = pollux.simulate(WORKLOAD, "fleet")
    tiresias = pollux.simulate(WORKLOAD, "tiresias")
    for result in (fleet, tiresias):
        assert (result.jobs, result.done) == (len(WORKLOAD), len(WORKLOAD))
        assert result.makespan > WORKLOAD.time.max()
        assert 0 < result.avg_jct <= result.p99_jct
        assert result.restarts is not None
    # fleet grows jobs as their measured throughput allows (each a restart); Tiresias never resizes
    assert fleet.restarts > tiresias.restarts


def test_fleet_sees_no_remaining_work_and_only_sizes_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, set[tuple[int, int]]] = {}
    calls = []
    real = pollux.decide

    def spy(jobs: Sequence[Elastic], *args: Any, **kwargs: Any) -> list[Resize]:
        for job in jobs:
            assert math.isinf(job.remaining)
            assert isinstance(job.profile, LearnedProfile)
            assert set(job.profile.observed) <= given.get(job.id, set())
        out = real(jobs, *args, **kwargs)
        for change in out:
            if change.new.gpus:
                given.setdefault(change.job_id, set()).add((change.new.gpus, change.new.batch))
        calls.append(len(jobs))
        return out

    monkeypatch.setattr(pollux, "decide", spy)
    result = pollux.simulate(WORKLOAD, "fleet")
    assert result.done == len(WORKLOAD)
    assert calls and max(calls) >= 2  # jobs overlapped: the step weighed them together


def test_a_job_that_ran_reports_its_throughput_and_noise_scale() -> None:
    workload = WORKLOAD.head(1)
    policy = pollux.FleetPolicy(lambda: cluster.current_time)
    cluster = pollux.FleetCluster(workload, policy)
    while not cluster.all_complete() and cluster.current_time < 3600:
        cluster.step(pollux.INTERVAL_S)
        known = cluster.get_job_infos()
        if known and next(iter(known.values())).measured:
            break
    (job,) = cluster.get_job_infos().values()
    assert job.measured and all(rate > 0 for rate in job.measured.values())
    assert job.noise_scale > 0 and job.attained_gpu_s > 0
    stored = pollux.stored(job)
    assert stored.measured == job.measured and stored.noise_scale == job.noise_scale


def test_the_published_pollux_result_is_the_artifact_mean() -> None:
    rows = [pollux.published(n, "1x", "pollux") for n in range(1, 9)]
    assert all(r.done == r.jobs == 160 and r.restarts is None for r in rows)
    # the artifact's own summary: 2,751 s over workloads 1-8 (Pollux, 1x)
    assert sum(r.avg_jct for r in rows) / 8 == pytest.approx(2751.13, abs=0.01)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workloads", "9"], "--workloads '9': numbers 1-8"),
        (["--policies", "fleet,slurm"], "--policies 'fleet,slurm'"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        pollux.main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_each_job_time_is_queued_restarting_or_running_and_adds_up_to_its_jct() -> None:
    result = pollux.simulate(WORKLOAD, "fleet")
    assert sorted(s.name for s in result.stats) == sorted(WORKLOAD.name)
    for stat in result.stats:
        assert stat.restarting_s >= 30  # its first start costs what a restart does
        assert stat.restarting_s <= 30 * (stat.restarts + 1)
        running = stat.jct - stat.waiting_s - stat.restarting_s
        assert running > 0 and stat.gpus >= 1 and 0 < stat.efficiency <= 1
    # the four jobs fit at once: each waits for the next round only
    assert max(s.waiting_s for s in result.stats) <= pollux.INTERVAL_S


def test_by_model_splits_the_gap_to_pollux_over_the_models_that_make_it() -> None:
    theirs = pollux.published_jcts(1, "1x")
    slower = {name for name in theirs if name.startswith("cifar10-")}
    stats = tuple(
        pollux.JobStat(
            name, name.rsplit("-", 1)[0], jct + (160 if name in slower else 0), 1, 0.0, 60.0, 2.0, 0.9
        )
        for name, jct in theirs.items()
    )
    result = pollux.Result(1, "fleet", "simulated", 160, 160, 0.0, 0.0, 0.0, 160, stats=stats)
    rows = {
        line.split(" | ")[1]: line.split(" | ") for line in pollux.by_model([result], "1x").splitlines()[2:]
    }
    # each slower cifar10 job adds 160 s / 160 jobs = 1 s to the workload's average
    assert rows["cifar10"][5] == f"+{len(slower)}"
    assert rows["ncf"][5] == "+0" and rows["all"][5] == f"+{len(slower)}"
    assert rows["cifar10"][2] == str(len(slower))


def test_by_model_refuses_a_partial_workload(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        pollux.main(["--workloads", "1", "--policies", "fleet", "--limit", "5", "--by-model"])
    assert exit_.value.code == 2
    assert "--by-model" in capsys.readouterr().err
