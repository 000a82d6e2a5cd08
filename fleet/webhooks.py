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
import ipaddress
import json
import socket
import ssl
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SIGNATURE_HEADER = "X-Fleet-Signature-256"
#: the most characters of a failure's reason kept (a status line, or why there was no answer)
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
        "event": "job.ended",
        "delivery": delivery,
        "at": now,
        "tenant": spec.tenant,
        "job": {
            "id": job.id,
            "name": spec.name,
            "state": str(job.state),
            "reason": job.reason[:REASON_MAX],
            "exit_code": job.exit_code,
            "attempt": job.attempt,
            "node": job.node,
            "owner": job.owner,
            "labels": spec.labels,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
        },
    }


def node_payload(
    name: str, state: str, previous: str, reason: str, delivery: str, now: float
) -> dict[str, Any]:
    """The JSON body for a node's change of state (``removed`` once retention forgot it)."""
    return {
        "event": "node.changed",
        "delivery": delivery,
        "at": now,
        "node": {"name": name, "state": state, "previous": previous, "reason": reason[:REASON_MAX]},
    }


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


class AddressRefused(ValueError):
    """A webhook's host is, or resolves to, an address fleet does not send to."""


def networks(allowed: Iterable[str]) -> list[IPNetwork]:
    """The operator's allow-list (``webhook_allowed_networks``) as networks."""
    return [ipaddress.ip_network(n, strict=False) for n in allowed]


def refused_kind(address: str, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Why fleet will not send to ``address`` (loopback, private, ...), or None: a public address, or
    one in ``allowed``. An IPv4 address written as IPv6 (``::ffff:127.0.0.1``) is judged as IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in network for network in allowed):
        return None
    for kind in ("loopback", "private", "link_local", "multicast", "reserved", "unspecified"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if ip.is_global else "not globally routable"


def literal_address(host: str) -> str | None:
    """``host`` as an IP address when it is written as one, in any form libc reads (``127.1``,
    ``0x7f000001``, ``[::1]``), else None (a name)."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return None
    return str(found[0][4][0])


def check_url(url: str, allowed: Sequence[IPNetwork] = ()) -> None:
    """At submit: refuse a URL whose host is written as an address fleet does not send to (a name is
    resolved, and checked, when a delivery is sent)."""
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    kind = None if address is None else refused_kind(address, allowed)
    if kind is not None:
        raise AddressRefused(
            f"webhook {shown_url(url)}: {host} is a {kind} address; fleet sends webhooks only to public "
            "addresses unless the operator lists the network in webhook_allowed_networks"
        )


def resolve(host: str, port: int, allowed: Sequence[IPNetwork] = ()) -> str:
    """The address to connect to for ``host``: each address it resolves to must be one fleet sends to
    (a name with one private address among public ones is refused), and the caller connects to the
    address checked here, never resolving again (a second answer could differ)."""
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos]
    for address in addresses:
        kind = refused_kind(address, allowed)
        if kind is not None:
            raise AddressRefused(f"{host} resolves to {address}, a {kind} address (webhook_allowed_networks)")
    return addresses[0]


class _Pinned(http.client.HTTPConnection):
    """HTTP to a checked address, with the URL's host in the Host header."""

    def __init__(self, address: str, host: str, port: int | None, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedTls(http.client.HTTPSConnection):
    """HTTPS to a checked address; the certificate is checked against the URL's host (SNI too)."""

    def __init__(self, address: str, host: str, port: int | None, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(
    url: str, body: bytes, headers: dict[str, str], timeout: float, allowed: Sequence[IPNetwork] = ()
) -> tuple[int | None, str]:
    """POST once: (HTTP status, its reason phrase) or (None, why there was no answer). Never raises;
    no redirect is followed (a webhook URL names its receiver). Only the status line is kept: a
    receiver's body is never shown (a URL pointed at an internal service must not read it out)."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection | None = None
    try:
        address = resolve(parts.hostname or "", port, allowed)
        conn = (_PinnedTls if secure else _Pinned)(address, parts.hostname or "", port, timeout)
        conn.request("POST", target, body, {"Content-Type": "application/json", **headers})
        answer = conn.getresponse()
        return answer.status, answer.reason[:ANSWER_MAX]
    except AddressRefused as exc:
        return None, f"refused: {exc}"[:ANSWER_MAX]
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:ANSWER_MAX]
    finally:
        if conn is not None:
            conn.close()


def backoff(attempts: int, base_s: float, cap_s: float = 600.0) -> float:
    """Seconds before the next try after ``attempts`` failed ones: base * 2^(attempts-1), capped."""
    return float(min(base_s * 2.0 ** max(attempts - 1, 0), cap_s))


def shown_url(url: str) -> str:
    """A webhook URL as others may see it: scheme and host (the path of a Slack URL is its secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/…"
