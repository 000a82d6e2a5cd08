"""Webhooks end to end: a real local HTTP server receives what the leader POSTs when a job ends or a
node changes state, signed with the tenant's secret, tried again after a failed answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from fleet import Client, JobSpec, JobState, SpecError
from fleet.keys import Keys
from fleet.state.webhooks import INIT, WebhookStore
from fleet.webhooks import verify
from tests.conftest import FleetProcs
from tests.support import until

pytestmark = pytest.mark.integration


@dataclass
class Receiver:
    """An HTTP server that keeps every POST and answers the codes in ``answers`` first, then 200."""

    url: str
    answers: list[int] = field(default_factory=list)
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def bodies(self) -> list[dict[str, object]]:
        return [json.loads(body) for _, body in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    shared = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            shared.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
            code = shared.answers.pop(0) if shared.answers else 200
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"busy" if code >= 400 else b"ok")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    shared.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield shared
    server.shutdown()
    server.server_close()


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def fleet(procs: FleetProcs, client: Client) -> FleetProcs:
    procs.env.update(
        FLEET_CONTROLLER__WEBHOOK_INTERVAL_S="0.2",
        FLEET_CONTROLLER__WEBHOOK_BACKOFF_S="0.5",
        FLEET_CONTROLLER__WEBHOOK_ATTEMPTS="3",
    )
    procs.one_node(client, "t-wh", gpus=1)
    return procs


def test_a_jobs_end_is_posted_signed_and_retried_after_a_500(
    fleet: FleetProcs, client: Client, receiver: Receiver
) -> None:
    # Given a receiver that answers its first POST with 500
    receiver.answers = [500]
    # When a job that asked to be notified ends
    job = client.submit(
        JobSpec(name="train", command=["true"], notify=f"{receiver.url}/hook", labels={"exp": "7"})
    )
    assert job.result(timeout=60).state == JobState.SUCCEEDED
    # Then the receiver gets it twice: the 500, then the retry it answers 200, as one delivery
    until(lambda: len(receiver.got) >= 2, "the retry")
    (first, body), (again, same) = receiver.got[:2]
    assert first["x-fleet-delivery"] == again["x-fleet-delivery"] and body == same
    assert first["x-fleet-event"] == "job.ended" and first["content-type"] == "application/json"
    # signed with the tenant's secret (HMAC-SHA256 of the body), which a wrong secret does not match
    secret = client.webhook_secret()
    assert verify(secret, body, first["x-fleet-signature-256"])
    assert not verify("whsec_wrong", body, first["x-fleet-signature-256"])
    payload = json.loads(body)
    assert payload["event"] == "job.ended" and payload["tenant"] == "default"
    assert {k: payload["job"][k] for k in ("id", "name", "state", "exit_code", "labels")} == {
        "id": job.id,
        "name": "train",
        "state": "SUCCEEDED",
        "exit_code": 0,
        "labels": {"exp": "7"},
    }
    # And the delivery log says how each attempt went, newest first
    log = until(lambda: [o for o in client.webhook_deliveries() if o.subject == job.id][:2], "the log")
    assert [(o.status, o.attempt, o.code) for o in log] == [("delivered", 2, 200), ("retrying", 1, 500)]
    assert log[1].error == "HTTP 500: Internal Server Error" and log[0].url == f"{receiver.url}/…"
    time.sleep(1)  # nothing more comes: delivered means done
    assert len(receiver.got) == 2


def test_a_tenant_webhook_in_slack_format_hears_jobs_and_nodes(
    fleet: FleetProcs, client: Client, receiver: Receiver
) -> None:
    # Given tenant default's webhook, Slack's format, node changes included
    client.set_tenant(
        "default", webhook={"url": f"{receiver.url}/slack", "format": "slack"}, webhook_nodes=True
    )
    # (node changes are news from the sender's first look at the nodes on: wait for it)
    hooks = WebhookStore(redis.Redis.from_url(fleet.redis_url, decode_responses=True), Keys())
    until(lambda: INIT in hooks.announced(), "the sender's first look at the nodes")
    # When a job fails and an operator cordons the node
    job = client.submit(JobSpec(name="bad", command=["sh", "-c", "exit 3"], max_attempts=1))
    job.wait(timeout=60)
    client.cordon("t-wh", reason="disk check")
    # Then the channel gets one {"text": ...} line for each
    failed = f":x: fleet: job `{job.id}` (bad, tenant default) FAILED: exited with code 3"
    cordoned = ":computer: fleet: node `t-wh` READY -> CORDONED: disk check"

    def heard() -> list[str] | None:
        texts = [str(b["text"]) for b in receiver.bodies()]
        return texts if any(t.startswith(failed) for t in texts) and cordoned in texts else None

    try:
        until(heard, "the job's end and the cordon")
    except AssertionError:
        raise AssertionError(f"{receiver.bodies()}\n{fleet.logs()}") from None
    hooks.redis.close()
    # And another tenant's user sees that a webhook exists, not its URL (a Slack URL is a secret)
    assert fleet.api is not None
    other = Client(client.url, fleet.api.token_for("bob", "other"))
    shown = next(t.tenant.webhook for t in other.tenants() if t.tenant.name == "default")
    assert shown is not None and shown.url == f"{receiver.url}/…"
    other.close()


def test_a_receiver_that_keeps_failing_is_given_up_and_said_so(
    fleet: FleetProcs, client: Client, receiver: Receiver
) -> None:
    receiver.answers = [503] * 10
    job = client.submit(JobSpec(name="j", command=["true"], notify=f"{receiver.url}/down"))
    job.result(timeout=60)
    failed = until(lambda: [o for o in client.webhook_deliveries() if o.status == "failed"], "given up")
    assert failed[0].attempt == 3 and failed[0].error == "HTTP 503: Service Unavailable"
    assert len(receiver.got) == 3
    # and the fleet schedules on meanwhile
    assert client.submit(JobSpec(name="k", command=["true"])).result(timeout=60).state == JobState.SUCCEEDED


def test_bad_webhook_urls_are_refused_with_the_fix(client: Client) -> None:
    for url, said in [
        ("ftp://x/y", "expected an http:// or https:// URL"),
        ("http://", "with a host"),
        ("https://h/" + "x" * 3000, "at most 2048 characters"),
    ]:
        with pytest.raises(SpecError, match=said):
            JobSpec(name="j", command=["true"], notify=url)
    with pytest.raises(SpecError, match=r"webhook\.url"):
        client.set_tenant("t", webhook="file:///etc/passwd")
    with pytest.raises(SpecError, match=r"notify\.format"):
        client.submit({"name": "j", "command": ["true"], "notify": {"url": "http://h/", "format": "teams"}})


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.2",
        "[::1]",
        "0x7f000002",
        "127.2",
        "[::ffff:127.0.0.2]",
        "169.254.169.254",
        "10.1.2.3",
        "192.168.0.1",
        "[fe80::1]",
        "224.0.0.1",
        "0.0.0.0",
    ],
)
def test_webhooks_to_internal_addresses_are_refused_at_submit(client: Client, host: str) -> None:
    # Given an operator who allows 127.0.0.1 alone (the tests' receivers), a user names another
    # loopback, private, link-local, metadata or multicast address, in any spelling libc reads
    with pytest.raises(SpecError, match=r"address; fleet sends webhooks only to public addresses"):
        client.submit({"name": "j", "command": ["true"], "notify": f"http://{host}:8080/x"})
    with pytest.raises(SpecError, match="webhook_allowed_networks"):
        client.set_tenant("t", webhook=f"http://{host}/")
    assert client.jobs() == []


def test_a_name_that_resolves_to_loopback_is_refused_when_sent(
    procs: FleetProcs, client: Client, receiver: Receiver
) -> None:
    # Given a controller whose operator allows no internal network, and a job whose webhook names a
    # host (nothing to check at submit) that resolves to loopback, where the receiver listens
    procs.env["FLEET_WEBHOOK_ALLOWED_NETWORKS"] = "[]"
    procs.one_node(client, "w-1", gpus=1)
    port = receiver.url.rsplit(":", 1)[1]
    job = client.submit(JobSpec(name="j", command=["true"], notify=f"http://localhost:{port}/x"))
    assert job.result(timeout=60).state == JobState.SUCCEEDED
    # Then the sender resolves it, sends nothing, and says why
    seen = until(lambda: [o for o in client.webhook_deliveries() if o.subject == job.id], "an outcome")
    assert seen[0].code is None and seen[0].error.startswith("refused: localhost resolves to 127.0.0.1")
    assert receiver.got == []


def test_a_node_that_stops_heartbeating_is_announced_down(
    fleet: FleetProcs, client: Client, receiver: Receiver
) -> None:
    # Given a tenant webhook that hears nodes
    client.set_tenant("default", webhook=f"{receiver.url}/nodes", webhook_nodes=True)
    until(lambda: client.tenants(), "the tenant's policy")
    # When the node's machine dies (no more heartbeats: its lease runs out, nothing is written)
    fleet.kill_node("t-wh")

    # Then the webhook hears it go DOWN, from READY, with the reason users see
    def down() -> dict[str, object] | None:
        return next(
            (
                b["node"]
                for b in receiver.bodies()
                if b["event"] == "node.changed" and b["node"]["state"] == "DOWN"
            ),
            None,
        )  # type: ignore[index]

    node = until(down, "the node's DOWN", timeout=30)
    assert node == {
        "name": "t-wh",
        "state": "DOWN",
        "previous": "READY",
        "reason": "lease expired (no heartbeat)",
    }
