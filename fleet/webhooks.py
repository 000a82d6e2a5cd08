"""Webhooks: what fleet POSTs when a job ends or a node changes state, how it is signed, and how a
receiver checks the signature.

Each delivery is one POST of a JSON body (or, for ``format="slack"``, the ``{"text": ...}`` a Slack
incoming webhook takes) with these headers:

- ``X-Fleet-Event``: ``job.ended`` or ``node.changed``
- ``X-Fleet-Delivery``: the delivery's id, the same on every retry (a receiver drops repeats by it)
- ``X-Fleet-Signature-256``: ``sha256=`` and the hex HMAC-SHA256 of the body, keyed with the tenant's
  webhook secret (``Client.webhook_secret()``), as GitHub signs its webhooks

A receiver verifies it with :func:`verify` (or the same three lines of ``hmac``), over the raw body
bytes, before it parses them. Delivery is at least once: any 2xx answer is success; anything else,
or no answer within ``controller.webhook_timeout_s``, is tried again with exponential backoff.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
from typing import Any
from urllib.parse import urlsplit

SIGNATURE_HEADER = "X-Fleet-Signature-256"
#: the most bytes of an answer kept to say why a delivery failed
ANSWER_MAX = 300
#: a reason longer than this is clipped in a payload (a body stays far below any server's limit)
REASON_MAX = 1000


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: ``sha256=<hex HMAC-SHA256 of body keyed by secret>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, signature: str | None) -> bool:
    """Whether ``signature`` (the ``X-Fleet-Signature-256`` header) is ``body``'s under ``secret``:
    compared in constant time."""
    return signature is not None and hmac.compare_digest(sign(secret, body), signature)


def job_payload(job: Any, delivery: str, now: float) -> dict[str, Any]:
    """The JSON body for a job's end (``job`` a :class:`fleet.models.Job`)."""
    spec = job.spec
    return {
        "event": "job.ended", "delivery": delivery, "at": now, "tenant": spec.tenant,
        "job": {
            "id": job.id, "name": spec.name, "state": str(job.state), "reason": job.reason[:REASON_MAX],
            "exit_code": job.exit_code, "attempt": job.attempt, "node": job.node, "owner": job.owner,
            "labels": spec.labels, "started_at": job.started_at, "finished_at": job.finished_at,
        },
    }  # fmt: skip


def node_payload(
    name: str, state: str, previous: str, reason: str, delivery: str, now: float
) -> dict[str, Any]:
    """The JSON body for a node's change of state (``removed`` once retention forgot it)."""
    return {
        "event": "node.changed", "delivery": delivery, "at": now,
        "node": {"name": name, "state": state, "previous": previous, "reason": reason[:REASON_MAX]},
    }  # fmt: skip


def slack_text(payload: dict[str, Any]) -> str:
    """One line for a Slack channel."""
    if payload["event"] == "job.ended":
        job = payload["job"]
        icon = {"SUCCEEDED": ":white_check_mark:", "FAILED": ":x:"}.get(job["state"], ":no_entry_sign:")
        where = f"({job['name']}, tenant {payload['tenant']})"
        return f"{icon} fleet: job `{job['id']}` {where} {job['state']}: {job['reason']}"
    node = payload["node"]
    why = f": {node['reason']}" if node["reason"] else ""
    return f":computer: fleet: node `{node['name']}` {node['previous']} -> {node['state']}{why}"


def body_for(payload: dict[str, Any], format: str) -> bytes:
    data = {"text": slack_text(payload)} if format == "slack" else payload
    return json.dumps(data, separators=(",", ":")).encode()


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """POST once: (HTTP status, what it said) or (None, why there was no answer). Never raises; no
    redirect is followed (a webhook URL names its receiver)."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "", parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", target, body, {"Content-Type": "application/json", **headers})
        answer = conn.getresponse()
        said = answer.read(ANSWER_MAX).decode(errors="replace").strip()
        return answer.status, said
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:ANSWER_MAX]
    finally:
        conn.close()


def backoff(attempts: int, base_s: float, cap_s: float = 600.0) -> float:
    """Seconds before the next try after ``attempts`` failed ones: base * 2^(attempts-1), capped."""
    return float(min(base_s * 2.0 ** max(attempts - 1, 0), cap_s))


def shown_url(url: str) -> str:
    """A webhook URL as others may see it: scheme and host (the path of a Slack URL is its secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/…"
