"""What the status pages show, from records: GPU cells, running rows, queue positions, shares, and
where a login may send the browser. Pure functions; the browser tests are in tests/integration."""

from __future__ import annotations

import pytest

from fleet import text
from fleet.api import views
from fleet.api.pages import _safe_next
from fleet.models import Gpu, Job, JobSpec, JobState, Member, Node, NodeState, Tenant, TenantStatus

NOW = 10_000.0


def gpu(index: int, **fields: object) -> Gpu:
    return Gpu.model_validate(
        {"uuid": f"GPU-{index}", "index": index, "model": "A100", "memory_total": 1, **fields}
    )


def job(job_id: str, tenant: str = "a", **fields: object) -> Job:
    spec = JobSpec.parse({"name": "j", "command": ["true"], "tenant": tenant})
    return Job.model_validate({"id": job_id, "spec": spec, "state": JobState.RUNNING, **fields})


def test_a_gpu_cell_names_only_the_jobs_the_reader_may_see() -> None:
    # Given a node whose GPU 0 holds a's job, GPU 1 b's, GPU 2 a foreign process, GPU 3 is lost
    node = Node(
        name="n1",
        state=NodeState.READY,
        alive=True,
        gpus=[
            gpu(3, healthy=False, health="lost: NVML error"),
            gpu(2, busy="busy: foreign pid 42"),
            gpu(1),
            gpu(0),
            gpu(4),
        ],
        claims={"GPU-0": "mine:1", "GPU-1": "theirs:3"},
        jobs=["mine", "theirs"],
    )
    # When a user of tenant a looks at it
    (card,) = views.node_cards([node], lambda j: j == "mine")
    # Then the cells go by index, name a's job, hide b's, and say why the others are not free
    assert [(c.gpu.index, c.status, c.job, c.note) for c in card.cells] == [
        (0, "claimed", "mine", "mine"),
        (1, "others", None, "another tenant's job"),
        (2, "busy", None, "busy: foreign pid 42"),
        (3, "unhealthy", None, "lost: NVML error"),
        (4, "free", None, "free"),
    ]
    assert (card.free, card.jobs, card.hidden_jobs) == (1, ["mine"], 1)


def test_a_running_row_has_its_duration_and_its_gpus_utilization() -> None:
    # Given a gang on two nodes, running for 90 s, and a job still starting there
    nodes = [
        Node(name="n1", state=NodeState.READY, alive=True, gpus=[gpu(0, utilization=80), gpu(1)]),
        Node(name="n2", state=NodeState.READY, alive=True, gpus=[gpu(0, uuid="GPU-n2-0", utilization=40)]),
    ]
    gang = job(
        "gang",
        started_at=NOW - 90,
        node="n1",
        gpus=["GPU-0"],
        members=[Member(node="n1", gpus=["GPU-0"]), Member(node="n2", gpus=["GPU-n2-0"])],
    )
    starting = job("starting", state=JobState.STARTING, state_since=NOW - 5, node="n1", gpus=["GPU-1"])
    rows = views.running_rows([gang, starting], nodes, NOW)
    # Then each shows how long it has been there and what its GPUs do
    assert [
        (r.duration_s, [(g.node, g.index, g.utilization) for g in r.gpus], r.utilization) for r in rows
    ] == [(90.0, [("n1", 0, 80), ("n2", 0, 40)], 60.0), (5.0, [("n1", 1, 0)], 0.0)]
    assert [text.took(s) for s in (5, 90, 3700)] == ["5s", "1m30s", "1h01m"]  # as `fleet jobs` writes it


def test_a_tenants_bar_is_scaled_to_the_fleet() -> None:
    busy = TenantStatus(tenant=Tenant(name="a", guaranteed_gpus=2), gpus_used=4, fair_share_gpus=2.0)
    over = TenantStatus(tenant=Tenant(name="b"), gpus_used=0, fair_share_gpus=16.0)
    (a, b) = views.tenant_rows([busy, over], total_gpus=8)
    assert (a.used, a.share, a.guarantee) == (0.25, 0.125, 0.125) and b.share == 1.0


@pytest.mark.parametrize(
    ("target", "goes_to"),
    [
        ("/ui/jobs/x-1?a=b", "/ui/jobs/x-1?a=b"),
        ("/ui", "/ui"),
        ("//evil.example/ui", "/ui"),
        ("https://evil.example/ui", "/ui"),
        ("/v1/jobs", "/ui"),
        ("/ui\\@evil", "/ui"),
        ("/uix", "/ui"),
    ],
)
def test_a_login_sends_the_browser_only_to_a_page_of_ours(target: str, goes_to: str) -> None:
    assert _safe_next(target) == goes_to


def test_a_queued_jobs_countdown_and_ordinals() -> None:
    waiting = job("w", state=JobState.QUEUED, not_before=NOW + 12)
    assert text.countdown(waiting, NOW) == "next attempt in 12s" and text.countdown(waiting, NOW + 20) == ""
    assert [text.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 102)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "102nd",
    ]
