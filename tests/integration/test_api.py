"""The API's front door: tokens, roles and tenants, as users, operators and admins meet them.

Every call goes through the session's real ``fleet api`` process (HTTP, real Redis); the CLI
runs as a real subprocess holding only the API's URL and a token.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import redis

from fleet import Client, JobSpec, JobState
from fleet.errors import ConfigError, Forbidden, NotFound, SpecError, Unauthorized
from fleet.keys import Keys
from fleet.models import QueuePosition
from fleet.ops.local import free_port
from fleet.state import NodeStore
from fleet.state.nodes import NodeInfo
from tests.conftest import Api, FleetProcs, self_signed_cert

pytestmark = pytest.mark.integration


def spec(name: str = "j", **fields: object) -> JobSpec:
    return JobSpec.parse({"name": name, "command": ["sleep", "600"], **fields})


def fleet(api: Api, *args: str, token: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet", *args],
        env={**api.env(token), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_user_acts_within_its_tenant_only(api: Api) -> None:
    # Given a user of tenant a with a job, and a user of tenant b
    alice, bob = api.client(api.token_for("alice", "a")), api.client(api.token_for("bob", "b"))
    mine = alice.submit(spec("mine"))
    theirs = bob.submit(spec("theirs"))
    # Then each job runs in its submitter's tenant
    assert (alice.get(mine.id).spec.tenant, bob.get(theirs.id).spec.tenant) == ("a", "b")
    # And bob can neither read, wait for, read the logs of, nor cancel alice's job: to him it is no
    # job at all, answered as an id nobody holds is (404, the same words), so he learns nothing of it
    ghost = "mine-000000000000"
    for call in (bob.get, bob.history, bob.logs, bob.cancel, lambda i: bob.wait(i, 0.1)):
        with pytest.raises(NotFound) as missing:
            call(ghost)
        with pytest.raises(NotFound) as hidden:
            call(mine.id)
        assert str(hidden.value) == str(missing.value).replace(ghost, mine.id)
    # And bob's listing holds only his own, even when he asks for another tenant's
    assert [j.id for j in bob.listing()] == [theirs.id]
    assert [j.id for j in bob.jobs()] == [theirs.id]
    with pytest.raises(Forbidden, match="tenant 'a'"):
        bob.listing(tenant="a")
    # And a cancel by label reaches only his tenant's jobs
    assert bob.cancel_labels({"x": "1"}).cancelled == []
    assert alice.get(mine.id).state == JobState.QUEUED
    # And he cannot submit into alice's tenant
    with pytest.raises(Forbidden, match="cannot submit to tenant 'a'"):
        bob.submit(spec("sneaky", tenant="a"))
    assert {j.spec.tenant for j in api.client().jobs()} == {"a", "b"}


def test_a_tenant_is_created_by_tenant_set_never_by_a_submit_naming_it(api: Api) -> None:
    # Given an admin and a tenant "vision" it created
    admin = api.client()
    admin.set_tenant("vision", weight=2)
    # When it submits to a misspelt tenant: refused (exit 2 from the CLI), naming the closest and
    # how to create one, and no tenant or job appears
    with pytest.raises(
        SpecError, match=r"tenant: no tenant 'vison' \(did you mean 'vision'\?\).*fleet tenant set"
    ):
        admin.submit(spec("typo", tenant="vison"))
    assert "vison" not in [t.tenant.name for t in admin.tenants()] and admin.jobs() == []
    # Then the tenant it created, and the default one, take jobs
    assert admin.submit(spec("ok", tenant="vision")).status().spec.tenant == "vision"
    assert admin.submit(spec("plain")).status().spec.tenant == "default"


def test_only_operators_cordon_and_drain_and_only_admins_issue_tokens(api: Api) -> None:
    # Given a node, a user and an operator
    user, operator = api.client(api.token_for("u", "a")), api.client(api.token_for("op", "ops", "operator"))
    register_node(api, "n1")
    # When the user tries to cordon or drain, or to issue a token: 403 naming the role it needs
    with pytest.raises(Forbidden, match="cannot cordon, uncordon or drain nodes: that needs role operator"):
        user.cordon("n1")
    with pytest.raises(Forbidden, match="needs role operator"):
        user.drain(["n1"])
    with pytest.raises(Forbidden, match="cannot manage tokens or tenants: that needs role admin"):
        user.create_token("x", "a")
    with pytest.raises(Forbidden, match="needs role admin"):
        operator.tokens()
    # Then the node is untouched; the user still sees it
    assert [(n.name, n.admin_state) for n in user.nodes()] == [("n1", "READY")]
    # And the operator may cordon it, recorded as done by the operator
    cordoned = operator.cordon("n1", "disk swap")
    assert (cordoned.admin_state, cordoned.reason, cordoned.changed_by) == ("CORDONED", "disk swap", "op")
    # And the operator sees every tenant's jobs; the user only its own
    job = api.client(api.token_for("v", "b")).submit(spec("other"))
    assert [j.id for j in operator.listing()] == [job.id] and user.listing() == []


def register_node(api: Api, name: str) -> None:
    """A node as its agent's heartbeat registers it (no agent needed to cordon it)."""
    client = redis.Redis.from_url(api.redis_url, decode_responses=True)
    info = NodeInfo(gpus=[], cpus=1, memory=1, runtime="process", gpu_backend="simulated")
    NodeStore(client, Keys()).heartbeat(name, "agent-1", 30, time.time(), info)
    client.close()


def test_a_revoked_or_expired_token_is_refused(api: Api, client: Client) -> None:
    # Given a token issued through the API, and one that expires in a second
    token, info = client.create_token("carol", "default", "user")
    short = api.token_for("dave", "a", expires_in_s=1)
    carol = api.client(token)
    assert carol.whoami().user == "carol" and api.client(short).whoami().user == "dave"
    # Then the admin sees both listed, never the tokens themselves
    listed = {t.id: t for t in client.tokens()}
    assert listed[info.id].user == "carol" and listed[info.id].created_by == "tester"
    assert token not in json.dumps([t.model_dump() for t in listed.values()])
    # When one is revoked and the other expires
    assert client.revoke_token(info.id).id == info.id
    time.sleep(1.2)
    # Then both are refused with 401, and so is no token, or a made-up one
    for refused in (token, short, "fleet_000000000000_" + "x" * 43, "nonsense"):
        with pytest.raises(Unauthorized, match="unknown, revoked or expired"):
            api.client(refused).whoami()
    with pytest.raises(NotFound, match="no token"):
        client.revoke_token(info.id)
    anonymous = urllib.request.Request(f"{api.url}/v1/jobs")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=10)
    assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"
    assert json.loads(refused.value.read())["error"] == "Unauthorized"


def test_the_cli_logs_in_with_a_token_and_keeps_no_redis_credential(api: Api, tmp_path: Path) -> None:
    # Given a token made on a server that holds the Redis credentials (how the first admin's is made),
    # refused for a tenant nobody created, then made once it is
    def direct(tenant: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "fleet",
                "token",
                "create",
                "--user",
                "erin",
                "--tenant",
                tenant,
                "--direct",
            ],
            env={**os.environ, "FLEET_REDIS_URL": api.redis_url},
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = direct("a")
    assert refused.returncode == 2 and "fleet tenant set a" in refused.stderr, refused.stderr
    assert "erin" not in [t.user for t in api.client().tokens()]  # nothing written
    api.client().set_tenant("a")
    made = direct("a")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("fleet_") and "Shown once" in made.stderr
    # When a user logs in with it (token on stdin, never in argv) and uses the CLI
    creds = tmp_path / "creds.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_CREDENTIALS"] = str(creds)
    login = subprocess.run(
        [sys.executable, "-m", "fleet", "login", api.url],
        input=token + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    assert "as erin (tenant a, role user)" in login.stdout
    run = subprocess.run(
        [sys.executable, "-m", "fleet", "submit", "--", "sleep", "600"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    who = subprocess.run(
        [sys.executable, "-m", "fleet", "whoami", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Then it works from the credentials file alone, which only its owner can read and which holds
    # the API's URL and the token, and no Redis URL or password
    assert run.returncode == 0, run.stderr
    assert api.client().get(run.stdout.strip()).spec.tenant == "a"
    assert json.loads(who.stdout)["user"] == "erin"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert json.loads(creds.read_text()) == {"url": api.url, "token": token, "ca_file": None}
    assert "redis" not in creds.read_text().lower()
    # And a user's token may not drain (exit 8, saying what is missing)
    drained = subprocess.run(
        [sys.executable, "-m", "fleet", "drain", "n1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert drained.returncode == 8 and "needs role operator" in drained.stderr
    # And logging out forgets it
    assert subprocess.run([sys.executable, "-m", "fleet", "logout"], env=env, timeout=60).returncode == 0
    gone = subprocess.run(
        [sys.executable, "-m", "fleet", "jobs"], env=env, capture_output=True, text=True, timeout=60
    )
    assert gone.returncode == 2 and "no fleet API: run `fleet login URL`" in gone.stderr


def test_token_commands_through_the_api(api: Api) -> None:
    # a tenant nobody created is refused, as --tenant is at submit, naming how to create it
    unknown = fleet(api, "token", "create", "--user", "frank", "--tenant", "b")
    assert unknown.returncode == 2 and "no tenant 'b'" in unknown.stderr, unknown.stderr
    assert "fleet tenant set b" in unknown.stderr and "frank" not in fleet(api, "token", "list").stdout
    assert fleet(api, "tenant", "set", "b").returncode == 0
    made = fleet(
        api,
        "token",
        "create",
        "--user",
        "frank",
        "--tenant",
        "b",
        "--role",
        "operator",
        "--expires",
        "2h",
        "-o",
        "json",
    )
    assert made.returncode == 0, made.stderr
    issued = json.loads(made.stdout)
    assert (issued["info"]["role"], issued["info"]["created_by"]) == ("operator", "tester")
    assert 7100 < issued["info"]["expires_at"] - time.time() <= 7200
    listed = fleet(api, "token", "list")
    assert "frank" in listed.stdout and issued["token"] not in listed.stdout
    assert fleet(api, "token", "revoke", issued["info"]["id"]).returncode == 0
    refused = fleet(api, "jobs", token=issued["token"])
    assert refused.returncode == 8 and "unknown, revoked or expired" in refused.stderr
    bad = fleet(api, "token", "create", "--user", "x y", "--tenant", "b")
    assert bad.returncode == 2 and "user" in bad.stderr


def test_the_api_describes_itself(api: Api) -> None:
    with urllib.request.urlopen(f"{api.url}/openapi.json", timeout=10) as answer:
        paths = json.loads(answer.read())["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}/logs", "/v1/drain", "/v1/tokens"} <= set(paths)


def test_https_with_a_certificate_the_client_verifies(api: Api, tmp_path: Path) -> None:
    # Given the API serving HTTPS with a certificate for 127.0.0.1 signed by nobody the system trusts
    cert, key = self_signed_cert(tmp_path)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "fleet",
        "api",
        "--port",
        str(port),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    ]
    env = {**os.environ, "FLEET_REDIS_URL": api.redis_url}
    server = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{port}"
    try:
        trusting = Client(url, api.token, ca_file=str(cert))
        api.clients.append(trusting)
        deadline = time.monotonic() + 30
        while True:
            try:
                # Then a client given the CA talks to it
                assert trusting.whoami().user == "tester"
                break
            except Exception:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.1)
        # And one that is not refuses it, saying how to fix it
        untrusting = Client(url, api.token)
        api.clients.append(untrusting)
        with pytest.raises(ConfigError, match=r"certificate cannot be verified .*FLEET_CA_FILE"):
            untrusting.whoami()
        trusting.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_tenants_are_set_by_admins_and_seen_by_everyone(api: Api) -> None:
    # When an admin sets a tenant, then changes only its limit
    made = fleet(api, "tenant", "set", "vision", "--guaranteed-gpus", "2", "--weight", "3", "--min-run", "5m")
    assert made.returncode == 0, made.stderr
    assert "2 GPUs guaranteed, no limit, weight 3" in made.stdout
    assert fleet(api, "tenant", "set", "vision", "--max-gpus", "8").returncode == 0
    both = fleet(api, "tenant", "set", "vision", "--guaranteed-cpus", "16", "--guaranteed-memory", "64g")
    assert "2 GPUs, 16 CPUs, 64GiB guaranteed, max 8" in both.stdout, both.stderr
    hook = ["--webhook", "https://hooks.example/T1", "--webhook-format", "slack", "--webhook-nodes"]
    hooked = fleet(api, "tenant", "set", "vision", *hook, "-o", "json")
    assert json.loads(hooked.stdout)["webhook"] == {"url": "https://hooks.example/T1", "format": "slack"}
    lone = fleet(api, "tenant", "set", "vision", "--webhook-format", "json")
    assert lone.returncode == 2 and "--webhook-format goes with --webhook URL" in lone.stderr
    assert fleet(api, "tenant", "set", "vision", "--allow-user", "4242:4343").returncode == 0
    # Then the tenant keeps what was not changed, and every user sees it (no jobs of others named,
    # nor its webhook's secret path, nor which host users its jobs may run as)
    user = api.token_for("u", "nlp")
    listed = json.loads(fleet(api, "tenants", "-o", "json", token=user).stdout)
    vision = next(t["tenant"] for t in listed if t["tenant"]["name"] == "vision")
    assert vision["webhook"]["url"] == "https://hooks.example/…" and vision["allowed_users"] == []
    own = json.loads(fleet(api, "tenants", "-o", "json", token=api.token_for("v", "vision")).stdout)
    assert next(t["tenant"] for t in own if t["tenant"]["name"] == "vision")["allowed_users"] == ["4242:4343"]
    assert (vision["guaranteed_gpus"], vision["max_gpus"], vision["weight"], vision["min_run_s"]) == (
        2,
        8,
        3,
        300,
    )
    assert (vision["guaranteed_cpus"], vision["guaranteed_memory"]) == (16, 64 << 30)
    assert "vision" in fleet(api, "tenants", token=user).stdout
    # And a user may not change it; a guarantee above the limit is refused naming both
    refused = fleet(api, "tenant", "set", "nlp", "--weight", "100", token=user)
    assert refused.returncode == 8 and "needs role admin" in refused.stderr
    bad = fleet(api, "tenant", "set", "vision", "--guaranteed-gpus", "9")
    assert bad.returncode == 2 and "guaranteed_gpus (9) is above max_gpus (8)" in bad.stderr
    # And deleting it puts its jobs back on the default policy
    assert fleet(api, "tenant", "delete", "vision").returncode == 0
    assert fleet(api, "tenant", "delete", "vision").returncode == 3


@pytest.fixture
def runtime() -> str:
    return "process"


def test_show_says_where_a_queued_job_stands_in_its_tenant_and_overall(api: Api, procs: FleetProcs) -> None:
    # Given a fleet with a controller and no node, tenant a's three jobs (one urgent) and tenant b's two
    procs.env["FLEET_CONTROLLER__USAGE_INTERVAL_S"] = "0.2"
    procs.controller()
    a, b = api.client(api.token_for("ann", "a")), api.client(api.token_for("ben", "b"))
    first = a.submit(spec("first"))
    b.submit(spec("b1", priority=5))
    last = a.submit(spec("last"))
    urgent = a.submit(spec("urgent", priority=10))
    b.submit(spec("b2"))
    # Then each job's place: by priority, then submission, within its tenant and overall
    assert a.position(urgent.id) == QueuePosition(
        tenant="a", in_tenant=1, tenant_queued=3, overall=1, queued=5
    )
    assert a.position(first.id) == QueuePosition(
        tenant="a", in_tenant=2, tenant_queued=3, overall=3, queued=5
    )
    assert a.position(last.id) == QueuePosition(tenant="a", in_tenant=3, tenant_queued=3, overall=4, queued=5)
    # And `fleet show` says it in words, with the tenant's use against its share
    shown = fleet(api, "show", last.id, token=api.token_for("ann", "a"))
    assert (
        "3rd of 3 in tenant a's queue (by priority, then submission); 3 of 5 queued jobs outrank it"
        in shown.stdout
    )
    deadline = time.monotonic() + 30
    while "Tenant:     a uses 0 GPUs; fair share now 0.0" not in shown.stdout:  # once the leader published
        assert time.monotonic() < deadline, shown.stdout + procs.logs()
        time.sleep(0.2)
        shown = fleet(api, "show", last.id, token=api.token_for("ann", "a"))
    # And a job that is no longer queued has no place
    a.cancel(first.id)
    assert a.position(first.id) is None


def test_jobs_list_who_submitted_them_and_how_they_ran(api: Api, procs: FleetProcs) -> None:
    # Given a fleet, and a user of tenant ml who submits a job that fails, and an array
    procs.one_node(api.client(), "t-1", gpus=1)
    token = api.token_for("mia", "ml")
    failed = fleet(api, "submit", "--max-attempts", "1", "--wait", "--", "sh", "-c", "exit 3", token=token)
    assert failed.returncode == 1, failed.stderr
    array = fleet(api, "submit", "--array", "0-1", "--", "true", token=token).stdout.strip()
    # Then each job records who submitted it, an array's tasks included
    mia = api.client(token)
    assert {j.owner for j in mia.jobs()} == {"mia"} and mia.array(array).owner == "mia"
    # And `fleet jobs` shows the user, the tenant, when the attempt started, how long and how it ended
    lines = fleet(api, "jobs", token=token).stdout.splitlines()
    header = lines[0].split()
    assert header == [
        "ID",
        "STATE",
        "USER",
        "TENANT",
        "GPUS",
        "NODE",
        "ATTEMPT",
        "START",
        "ELAPSED",
        "EXIT",
        "PROGRESS",
        "REASON",
    ]
    job_line = next(line.split() for line in lines if line.startswith("sh-") and not line.startswith(array))
    assert job_line[1:5] == ["FAILED", "mia", "ml", "0"] and job_line[9] == "3"
    assert re.fullmatch(r"\d\d:\d\d:\d\d", job_line[7]) and re.fullmatch(r"\d+s", job_line[8])


def test_a_user_sees_which_gpus_another_tenant_holds_not_its_jobs(api: Api, procs: FleetProcs) -> None:
    # Given tenant a's job and tenant b's job running on one node
    procs.controller()
    procs.agent("t-seen", gpus=2)
    a, b, admin = api.client(api.token_for("ann", "a")), api.client(api.token_for("ben", "b")), api.client()
    procs.wait_nodes(a, 1)
    mine = a.submit(JobSpec(name="mine", gpus=1, command=["sleep", "60"]))
    theirs = b.submit(JobSpec(name="theirs", gpus=1, command=["sleep", "60"]))
    deadline = time.monotonic() + 30
    while sorted(admin.node("t-seen").jobs) != sorted([mine.id, theirs.id]):
        assert time.monotonic() < deadline, procs.logs()
        time.sleep(0.1)
    # Then ann sees her job by name and that the other GPU is held, not by which job
    for node in (a.node("t-seen"), *a.nodes()):
        assert node.jobs == [mine.id]
        assert sorted(node.claims.values()) == sorted([f"{mine.id}:1", "another tenant's job"])
    shown = fleet(api, "nodes", "t-seen", token=api.token_for("ann", "a"))
    assert theirs.id not in shown.stdout and "claimed by another tenant's job" in shown.stdout
    # And an admin sees both
    assert sorted(admin.node("t-seen").claims.values()) == sorted([f"{mine.id}:1", f"{theirs.id}:1"])
    a.cancel(mine.id)
    b.cancel(theirs.id)
    for client in (a, b, admin):
        client.close()


def test_a_followed_log_stops_once_its_token_is_revoked(api: Api, client: Client, procs: FleetProcs) -> None:
    # Given carol following the output of her job, which prints a line every 0.2 s for a minute
    procs.controller()
    procs.agent("t-follow", gpus=1)
    token, info = client.create_token("carol", "default", "user")
    carol = api.client(token)
    procs.wait_nodes(carol, 1)
    job = carol.submit(
        JobSpec(name="talk", command=["sh", "-c", "for i in $(seq 300); do echo $i; sleep 0.2; done"])
    )
    lines = carol.follow_logs(job.id)
    assert next(lines).line == "1"
    # When an admin revokes her token
    client.revoke_token(info.id)
    revoked = time.monotonic()
    # Then her stream ends within a couple of seconds, though the job talks on
    rest = [line.line for line in lines]
    assert time.monotonic() - revoked < 10 and len(rest) < 50, rest
    assert client.get(job.id).state == JobState.RUNNING
    client.cancel(job.id)
    carol.close()


def test_an_image_from_a_registry_the_operator_does_not_list_is_refused_at_submit(client: Client) -> None:
    with pytest.raises(SpecError, match=r"registry 'evil.example.com', which is not one the operator allows"):
        client.submit(JobSpec(name="mine", image="evil.example.com/miner:1", command=["true"]))
    assert client.jobs() == []
    # an image of a registry the shipped list names is taken
    assert client.submit(JobSpec(name="ok", image="nvcr.io/nvidia/pytorch:24.01", command=["true"])).id


def test_a_batch_submit_keeps_every_check_of_a_single_one(api: Api) -> None:
    # Given a user of tenant a, whose jobs may run as host user 1000:1000 and no other
    admin, alice = api.client(), api.client(api.token_for("alice", "a"))
    admin.set_tenant("a", allowed_users=["1000:1000"])
    # When her batch holds one job for another tenant, or one with an image the operator does not
    # allow, or one running as a user her tenant does not allow, or an upload that never happened
    refusals = [
        (spec("sneaky", tenant="b"), Forbidden, r"jobs\[1\]: .*cannot submit to tenant 'b'"),
        (spec("miner", image="evil.example.com/m:1"), SpecError, r"jobs\[1\]: .*registry 'evil.example.com'"),
        (spec("other", user="2000:2000"), SpecError, r"jobs\[1\]: user '2000:2000': tenant a's jobs may not"),
        (spec("wd", workdir="sha256:" + "0" * 64), SpecError, r"jobs\[1\]: workdir sha256:0+: not uploaded"),
    ]
    for bad, error, said in refusals:
        # Then the batch is refused naming the job, as the job alone would be, and nothing is queued
        with pytest.raises(error, match=said):
            alice.submit_many([spec("fine"), bad])
        with pytest.raises(error):
            alice.submit(bad)
    assert admin.jobs() == []
    # And a batch of the API's own shape is checked field by field, naming index and field
    with pytest.raises(SpecError, match=r"bad request: jobs\.0\.spec: Field required"):
        alice._call("POST", "/v1/jobs/batch", {"jobs": [{"id": "x"}]})
    # And a key the call does not define is refused, named, not dropped (the spec's own are too)
    unknown = r"bad request: jobs\.0\.bogus: not a field of this call: leave it out"
    with pytest.raises(SpecError, match=unknown):
        alice._call(
            "POST", "/v1/jobs/batch", {"jobs": [{"spec": {"name": "n", "command": ["true"]}, "bogus": 1}]}
        )
    with pytest.raises(SpecError, match=r"bad request: bogus: not a field of this call"):
        alice._call("POST", "/v1/jobs", {"spec": {"name": "n", "command": ["true"]}, "bogus": 1})
    with pytest.raises(SpecError, match=r"bad request: max_runing: not a field of this call"):
        alice._call(
            "POST",
            "/v1/arrays",
            {"spec": {"name": "a", "command": ["true"]}, "indices": "0-1", "max_runing": 1},
        )
    with pytest.raises(SpecError, match=r"jobs\[0\]: invalid job spec:\s+command: is required"):
        alice._call("POST", "/v1/jobs/batch", {"jobs": [{"spec": {"name": "n"}}]})
    # And the cap is the API's too (the Client checks it first), saying what to do instead
    many = {"jobs": [{"spec": {"name": "n", "command": ["true"]}}] * 1001}
    with pytest.raises(SpecError, match=r"jobs: 1001 jobs in one batch; give 1 to 1000 \(split"):
        alice._call("POST", "/v1/jobs/batch", many)
    with pytest.raises(SpecError, match=r"jobs: 0 jobs in one batch"):
        alice._call("POST", "/v1/jobs/batch", {"jobs": []})
    # And a batch is one body, under the same limit as a single submit's (api.max_body_bytes, 1 MiB)
    big = [spec(f"big{i}", env={"PAYLOAD": "x" * 8000}) for i in range(200)]
    with pytest.raises(SpecError, match=r"request body: \d+ bytes, more than api.max_body_bytes"):
        alice.submit_many(big)
    # And a token that is not one is refused before the body is read
    with pytest.raises(Unauthorized):
        Client(api.url, "fleet_000000000000_" + "a" * 43).submit_many([spec("x")])
    assert admin.jobs() == []
    # While a batch of her own tenant's jobs is queued, hers, in her tenant
    queued = alice.submit_many([spec("ok1"), spec("ok2", user="1000:1000")])
    assert [(j.spec.tenant, j.owner) for j in map(alice.get, [h.id for h in queued])] == [("a", "alice")] * 2


def test_one_kept_alive_connection_serves_a_loop_of_calls(api: Api) -> None:
    # Given a client that makes many calls one after another, and a batch
    client = api.client()
    port = urlsplit(api.url).port
    for i in range(30):
        client.submit(spec(f"loop{i}"))
        client.whoami()
    client.submit_many([spec("b1"), spec("b2")])
    # Then one connection carried them all: the client opened one, and the API sees one from here
    mine = [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]
    assert client.transport.opened == 1 and len([c for c in mine if c.status == "ESTABLISHED"]) == 1
    assert len(client.jobs()) == 32
    # And an AsyncClient's pool holds at most one connection per thread, however many calls it makes
    from fleet.aio import AsyncClient

    async def many() -> int:
        async with AsyncClient(api.url, api.token, max_threads=2) as aio_client:
            answers = await asyncio.gather(*(aio_client.whoami() for _ in range(40)))
            assert {a.user for a in answers} == {"tester"}
            return aio_client.sync.transport.opened

    assert 1 <= asyncio.run(many()) <= 2
