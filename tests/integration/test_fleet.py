"""Several nodes and many jobs: every job runs, GPUs are never shared, priority is honoured."""

from __future__ import annotations

import itertools
import re

import pytest

from fleet import Client, JobSpec, JobState
from tests.conftest import FleetProcs

pytestmark = pytest.mark.integration

# Each job reports, from inside, what it saw: its GPUs and its start and end on the kernel's clock.
PROBE = (
    'echo "start $(cut -d" " -f1 /proc/uptime) $CUDA_VISIBLE_DEVICES"; sleep {secs}; '
    'echo "end $(cut -d" " -f1 /proc/uptime)"'
)


def probe(name: str, gpus: int, secs: float = 1, priority: int = 0) -> JobSpec:
    return JobSpec.parse(
        {"name": name, "gpus": gpus, "priority": priority, "command": ["sh", "-c", PROBE.format(secs=secs)]}
    )


def seen(client: Client, job_id: str) -> tuple[float, float, set[str]]:
    text = "\n".join(line.line for line in client.logs(job_id))
    start = re.search(r"start (\S+) (\S*)", text)
    end = re.search(r"end (\S+)", text)
    assert start and end, text
    return float(start.group(1)), float(end.group(1)), set(filter(None, start.group(2).split(",")))


@pytest.fixture
def two_nodes(procs: FleetProcs, client: Client) -> FleetProcs:
    procs.controller()
    procs.agent("t-a", gpus=2)
    procs.agent("t-b", gpus=2)
    procs.wait_nodes(client, 2)
    return procs


def test_a_dozen_jobs_share_four_gpus_without_overlap(two_nodes: FleetProcs, client: Client) -> None:
    # Given two nodes with two GPUs each, When twelve jobs of one or two GPUs are submitted at once
    handles = [client.submit(probe(f"j{i}", gpus=1 + i % 2)) for i in range(12)]
    finished = [h.wait(timeout=120) for h in handles]
    # Then every job succeeds, on a node, with the GPUs it asked for
    assert [j.state for j in finished] == [JobState.SUCCEEDED] * 12, two_nodes.logs()
    runs = {h.id: seen(client, h.id) for h in handles}
    for job in finished:
        assert len(runs[job.id][2]) == job.spec.gpus and runs[job.id][2] == set(job.gpus)
    assert {j.node for j in finished} == {"t-a", "t-b"}
    # And no GPU was ever held by two running jobs, as the containers themselves saw it
    for (a, (sa, ea, ga)), (b, (sb, eb, gb)) in itertools.combinations(runs.items(), 2):
        if ga & gb:
            assert ea <= sb or eb <= sa, f"{a} and {b} overlapped on {ga & gb}"
    # And queued jobs started as GPUs freed up: at most 4 GPUs' worth ran at any time
    for t, _, _ in runs.values():
        assert sum(len(g) for s, e, g in runs.values() if s <= t < e) <= 4
    assert all(n.claims == {} for n in client.nodes())


def test_higher_priority_job_submitted_later_starts_first(two_nodes: FleetProcs, client: Client) -> None:
    # Given all four GPUs busy and a backlog of low-priority jobs
    busy = [client.submit(probe(f"busy{i}", gpus=2, secs=2)) for i in range(2)]
    backlog = [client.submit(probe(f"low{i}", gpus=2, secs=0.5)) for i in range(3)]
    # When a high-priority job is submitted after them
    urgent = client.submit(probe("urgent", gpus=2, secs=0.5, priority=10))
    for h in [*busy, *backlog, urgent]:
        assert h.wait(timeout=120).state == JobState.SUCCEEDED, two_nodes.logs()
    # Then it was given GPUs no later than any job of the backlog (when two nodes free up at once,
    # one pass places it and a backlog job together, and which container starts first is a race)
    placed = {
        h.id: next(e.at for e in h.history() if e.state == JobState.SCHEDULED) for h in [*backlog, urgent]
    }
    assert all(placed[urgent.id] <= placed[h.id] for h in backlog), placed
