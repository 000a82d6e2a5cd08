"""The controller's reconcile, pure: jobs on nodes, nodes and claims sorted into buckets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet.config_sections import ControllerSettings
from fleet.controller.reconcile import Buckets, reconcile
from fleet.models import ExitKind, Job, JobSpec, JobState, Node, NodeState

SPEC = JobSpec(name="j", command=["true"], gpus=1)
CFG = ControllerSettings(scheduled_timeout_s=60, starting_timeout_s=1800)
NOW = 10_000.0


def node(name: str, alive: bool = True, admin: NodeState = NodeState.READY, **kw: object) -> Node:
    state = admin if alive else NodeState.DOWN
    return Node(name=name, state=state, admin_state=admin, alive=alive, heartbeat_at=NOW, **kw)  # type: ignore[arg-type]


def job(jid: str, state: JobState, on: str | None, since: float = NOW, attempt: int = 1, **kw: object) -> Job:
    return Job(id=jid, spec=SPEC, state=state, node=on, attempt=attempt, state_since=since, **kw)  # type: ignore[arg-type]


# -- examples: what each bucket says ------------------------------------------------------------


def test_jobs_of_a_dead_node_or_a_node_without_record_are_lost() -> None:
    buckets = reconcile(
        [node("dead", alive=False)],
        [job("a", JobState.RUNNING, "dead"), job("b", JobState.STARTING, "gone")],
        {},
        NOW,
        CFG,
    )
    assert [(r.job.id, r.exit.kind, r.exit.reason, r.stop) for r in buckets.requeue_lost] == [
        ("a", ExitKind.NODE_DOWN, "node dead down (lease expired)", False),
        ("b", ExitKind.NODE_DOWN, "node gone has no record", False),
    ]


def test_launches_past_their_deadline_time_out_and_are_stopped() -> None:
    jobs = [
        job("sched", JobState.SCHEDULED, "n", since=NOW - 61),
        job("start", JobState.STARTING, "n", since=NOW - 1801),
        job("fresh", JobState.STARTING, "n", since=NOW - 1799),
        job("long", JobState.RUNNING, "n", since=NOW - 10**6),
    ]
    buckets = reconcile([node("n")], jobs, {}, NOW, CFG)
    assert [(r.job.id, r.exit.kind, r.exit.reason, r.stop) for r in buckets.timeouts] == [
        (
            "sched",
            ExitKind.LAUNCH_TIMEOUT,
            "launch timed out: SCHEDULED on n for 61s (scheduled_timeout_s = 60)",
            True,
        ),
        (
            "start",
            ExitKind.LAUNCH_TIMEOUT,
            "launch timed out: STARTING on n for 1801s (starting_timeout_s = 1800)",
            True,
        ),
    ]
    assert buckets.ignore == ("fresh", "long")


def test_drain_past_its_deadline_stops_each_job_once_then_the_node_is_drained() -> None:
    draining = node("d", admin=NodeState.DRAINING, drain_deadline=NOW - 1, drain_grace_s=30)
    buckets = reconcile(
        [draining, node("e", admin=NodeState.DRAINING, drain_deadline=NOW + 60)],
        [job("a", JobState.RUNNING, "d"), job("b", JobState.RUNNING, "d", preempt="node d drained")],
        {},
        NOW,
        CFG,
    )
    assert [(s.job.id, s.reason, s.grace_s) for s in buckets.drain_stops] == [("a", "node d drained", 30)]
    assert buckets.ignore == ("b",) and buckets.drained == ("e",)


def test_claims_not_held_by_a_current_attempt_on_a_node_are_orphans() -> None:
    jobs = [job("a", JobState.RUNNING, "n", attempt=2), job("done", JobState.SUCCEEDED, "n")]
    claims = {"g0": "a:2", "g1": "a:1", "g2": "done:1", "g3": "never:1"}
    buckets = reconcile([node("n")], jobs, claims, NOW, CFG)
    assert buckets.orphan_claims == (("g1", "a:1"), ("g2", "done:1"), ("g3", "never:1"))


# -- properties ---------------------------------------------------------------------------------

NAMES = ["n0", "n1", "n2"]
nodes_st = st.lists(
    st.builds(
        node,
        st.sampled_from(NAMES),
        alive=st.booleans(),
        admin=st.sampled_from([s for s in NodeState if s != NodeState.DOWN]),
        drain_deadline=st.none() | st.floats(NOW - 100, NOW + 100),
        drain_grace_s=st.floats(0, 60),
    ),
    unique_by=lambda n: n.name,
)
jobs_st = st.lists(
    st.builds(
        job,
        st.sampled_from([f"j{i}" for i in range(8)]),
        st.sampled_from(list(JobState)),
        st.sampled_from([*NAMES, "gone"]),
        since=st.floats(NOW - 4000, NOW),
        attempt=st.integers(1, 3),
        preempt=st.sampled_from(["", "node n0 drained"]),
        cancel_requested=st.booleans(),
    ),
    unique_by=lambda j: j.id,
)
claims_st = st.dictionaries(
    st.sampled_from([f"g{i}" for i in range(10)]),
    st.builds(lambda i, a: f"j{i}:{a}", st.integers(0, 9), st.integers(1, 3)),
)
cfg_st = st.builds(
    ControllerSettings, scheduled_timeout_s=st.floats(1, 120), starting_timeout_s=st.floats(1, 4000)
)


def job_buckets(b: Buckets) -> list[str]:
    return [
        *(r.job.id for r in b.requeue_lost),
        *(r.job.id for r in b.timeouts),
        *(s.job.id for s in b.drain_stops),
        *b.ignore,
    ]


@given(nodes_st, jobs_st, claims_st, cfg_st)
def test_every_job_on_a_node_is_in_exactly_one_bucket(
    nodes: list[Node], jobs: list[Job], claims: dict[str, str], cfg: ControllerSettings
) -> None:
    b = reconcile(nodes, jobs, claims, NOW, cfg)
    assert sorted(job_buckets(b)) == sorted(j.id for j in jobs if j.state.on_node)


@given(nodes_st, jobs_st, claims_st, cfg_st)
def test_a_job_on_a_live_node_within_its_deadlines_is_never_requeued(
    nodes: list[Node], jobs: list[Job], claims: dict[str, str], cfg: ControllerSettings
) -> None:
    b = reconcile(nodes, jobs, claims, NOW, cfg)
    live = {n.name for n in nodes if n.alive}
    limits = {JobState.SCHEDULED: cfg.scheduled_timeout_s, JobState.STARTING: cfg.starting_timeout_s}
    requeued = {r.job.id for r in (*b.requeue_lost, *b.timeouts)}
    for j in jobs:
        if j.node in live and NOW - j.state_since <= limits.get(j.state, float("inf")):
            assert j.id not in requeued


@given(nodes_st, jobs_st, claims_st, cfg_st)
def test_lost_is_exactly_the_jobs_whose_node_is_dead_or_unknown(
    nodes: list[Node], jobs: list[Job], claims: dict[str, str], cfg: ControllerSettings
) -> None:
    b = reconcile(nodes, jobs, claims, NOW, cfg)
    live = {n.name for n in nodes if n.alive}
    assert {r.job.id for r in b.requeue_lost} == {
        j.id for j in jobs if j.state.on_node and j.node not in live
    }
    assert all(r.exit.kind == ExitKind.NODE_DOWN and not r.stop for r in b.requeue_lost)
    assert all(r.job.state in (JobState.SCHEDULED, JobState.STARTING) and r.stop for r in b.timeouts)


@given(nodes_st, jobs_st, claims_st, cfg_st)
def test_every_claim_is_either_an_orphan_or_held_by_a_job_in_a_bucket(
    nodes: list[Node], jobs: list[Job], claims: dict[str, str], cfg: ControllerSettings
) -> None:
    b = reconcile(nodes, jobs, claims, NOW, cfg)
    in_a_bucket = set(job_buckets(b))
    held = {f"{j.id}:{j.attempt}" for j in jobs if j.id in in_a_bucket}
    orphans = dict(b.orphan_claims)
    assert len(orphans) == len(b.orphan_claims)
    for uuid, holder in claims.items():
        assert (uuid in orphans) != (holder in held)


@given(nodes_st, jobs_st, claims_st, cfg_st)
def test_drained_nodes_are_draining_and_empty_and_drain_stops_are_due(
    nodes: list[Node], jobs: list[Job], claims: dict[str, str], cfg: ControllerSettings
) -> None:
    b = reconcile(nodes, jobs, claims, NOW, cfg)
    occupied = {j.node for j in jobs if j.state.on_node}
    assert set(b.drained) == {n.name for n in nodes if n.admin_state == NodeState.DRAINING} - occupied
    by_name = {n.name: n for n in nodes}
    for stop in b.drain_stops:
        n = by_name[stop.job.node or ""]
        assert n.alive and n.drain_deadline is not None and n.drain_deadline <= NOW and not stop.job.preempt
