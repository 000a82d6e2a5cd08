"""Callers that hold many waits and followed logs open cannot take the API from everyone else.

Each wait (``GET /v1/jobs/X/wait?timeout_s=30``) and followed log used to hold a worker thread and a
Redis connection of its own: 250 of them took the API's pool, every other caller got 503 for 30 s,
and a wait went on after its client hung up. Every call here goes over a real socket to a real
``fleet api`` process on the session's Redis.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import pytest
import redis

from fleet import Client, JobSpec
from fleet.config import load_settings
from fleet.errors import TooManyRequests
from fleet.keys import Keys
from fleet.models import Role
from fleet.state import connect
from fleet.state.tokens import TokenStore
from fleet.state.watch import Interest, StreamWatch
from tests.integration.test_api_limits import OwnApi, _start_api

pytestmark = pytest.mark.integration
#: connections of the API's blob store, none of them used here
BLOBS = 2


@dataclass
class Open:
    """A call sent over a socket of its own whose answer is not read yet."""

    sock: socket.socket
    head: bytes = b""

    def status(self) -> int:
        """The status of the answer, once its head is in (a followed log's comes at once)."""
        while b"\r\n\r\n" not in self.head:
            data = self.sock.recv(4096)
            assert data, f"the API hung up without an answer: {self.head!r}"
            self.head += data
        return int(self.head.split(b" ", 2)[1])

    def answer(self) -> tuple[int, bytes]:
        """The status and the whole body (the server closes the connection after it)."""
        status = self.status()
        raw = self.head
        while data := self.sock.recv(65536):
            raw += data
        self.sock.close()
        head, body = raw.split(b"\r\n\r\n", 1)
        return status, _unchunked(body) if b"transfer-encoding: chunked" in head.lower() else body


def _unchunked(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + body[:n], body[n + 2 :]
    return out


def send(port: int, token: str, path: str) -> Open:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token}", "Connection: close"]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    return Open(sock)


def hold(port: int, token: str, paths: list[str], probe: str) -> list[Open]:
    """A call of ``token`` to each of ``paths``, all held by the API: shown by the token's next call to
    ``probe`` (a wait) being refused (429). A call refused while a probe took a slot is sent again."""
    calls = [send(port, token, path) for path in paths]
    deadline = time.monotonic() + 30
    with Client(f"http://127.0.0.1:{port}", token) as client:
        while True:
            for i, call in enumerate(calls):
                if select.select([call.sock], [], [], 0)[0] and call.status() != 200:
                    assert call.answer()[0] == 429, call.head
                    calls[i] = send(port, token, paths[i])
            try:
                client._call("GET", probe, query={"timeout_s": "0"})
            except TooManyRequests as exc:
                assert "api.max_waits_per_token" in str(exc)
                return calls
            assert time.monotonic() < deadline, "the API did not hold every call within 30 s"


def tokens(redis_url: str, users: list[str], tenant: str = "default") -> list[str]:
    client = connect(load_settings(redis_url=redis_url))
    made = [TokenStore(client, Keys()).create(user, tenant, Role.USER)[0] for user in users]
    client.close()
    return made


def api_connections(api: OwnApi, redis_url: str) -> list[dict[str, Any]]:
    """The clients Redis lists (CLIENT LIST) whose socket belongs to the API process."""
    mine = {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process(api.proc.pid).net_connections("tcp")}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return [c for c in client.client_list() if c["addr"] in mine]
    finally:
        client.close()


@pytest.fixture
def limited_api(redis_url: str) -> Iterator[OwnApi]:
    """An API allowing each token 15 waits and followed logs at once, on an empty Redis (a node an
    earlier test registered would make a 1-GPU job unplaceable, or run it)."""
    yield from _start_api(redis_url, FLEET_API__MAX_WAITS_PER_TOKEN="15")


def test_many_held_waits_and_follows_leave_others_served_on_few_redis_connections(
    limited_api: OwnApi, redis_url: str
) -> None:
    api = limited_api
    # Given 14 users of one tenant, and a job of theirs that stays queued (no node runs it)
    users = tokens(redis_url, [f"u{i}" for i in range(14)])
    alice = Client(f"http://127.0.0.1:{api.port}", api.token)
    job = alice.submit(JobSpec(name="held", gpus=1, command=["true"]))
    wait, follow = f"/v1/jobs/{job.id}/wait?timeout_s=30", f"/v1/jobs/{job.id}/logs?follow=true"
    # When each user holds as many calls as a token may, 10 waits of 30 s and 5 followed logs (210
    # in all), the API holding every one (the user's next call refused)
    held = [hold(api.port, token, [wait] * 10 + [follow] * 5, f"/v1/jobs/{job.id}/wait") for token in users]
    waits, follows = [c for calls in held for c in calls[:10]], [c for calls in held for c in calls[10:]]
    assert {f.status() for f in follows} == {200}
    # And another tenant's ordinary calls are served meanwhile, none refused
    bob = Client(f"http://127.0.0.1:{api.port}", tokens(redis_url, ["bob"], "other")[0])
    for i in range(10):
        mine = bob.submit(JobSpec(name=f"b{i}", gpus=1, command=["true"]))
        assert bob.get(mine.id).state == "QUEUED"
        assert mine.id in {j.id for j in bob.listing()}
    # And the API holds a few Redis connections, not one per waiter: its calls share
    # api.redis_connections (32), its waiters one more
    connections = api_connections(api, redis_url)
    assert len(connections) <= 32 + 1 + BLOBS, [(c["addr"], c["cmd"]) for c in connections]
    # And once the job ends, every wait answers at once with it, and every follow ends
    alice.cancel(job.id)
    answers = [w.answer() for w in waits]
    assert {(status, json.loads(body)["state"]) for status, body in answers} == {(200, "CANCELLED")}
    assert {f.answer() for f in follows} == {(200, b"")}
    alice.close()
    bob.close()


@pytest.mark.parametrize("kind", ["wait", "follow"])
def test_a_call_whose_client_hangs_up_ends_at_once(redis_url: str, kind: str) -> None:
    # Given an API allowing each token 4 blocking calls, and a job that stays queued
    gen = _start_api(redis_url, FLEET_API__MAX_WAITS_PER_TOKEN="4")
    api = next(gen)
    client = Client(f"http://127.0.0.1:{api.port}", api.token)
    job = client.submit(JobSpec(name="queued", gpus=1, command=["true"]))
    path = f"/v1/jobs/{job.id}/wait?timeout_s=30" if kind == "wait" else f"/v1/jobs/{job.id}/logs?follow=true"
    try:
        # When the token holds 4 waits of 30 s (or 4 followed logs), the most it may
        held = hold(api.port, api.token, [path] * 4, f"/v1/jobs/{job.id}/wait")
        # And their clients hang up
        for call in held:
            call.sock.close()
        # Then the API drops them at once: the token's slots come back long before the 30 s are up
        deadline = time.monotonic() + 10
        while True:
            try:
                assert (
                    client._call("GET", f"/v1/jobs/{job.id}/wait", query={"timeout_s": "0"})["id"] == job.id
                )
                break
            except TooManyRequests:
                assert time.monotonic() < deadline, f"the {kind}s of clients that hung up still held"
                time.sleep(0.05)
        # And 4 calls may be held again
        for call in hold(api.port, api.token, [path] * 4, f"/v1/jobs/{job.id}/wait"):
            call.sock.close()
    finally:
        client.close()
        next(gen, None)


def test_one_read_wakes_each_waiter_whose_stream_grew_and_forgets_the_dropped(redis_url: str) -> None:
    settings, keys = load_settings(redis_url=redis_url), Keys()
    writer = connect(settings)
    watch = StreamWatch(settings, keys, writer)
    try:
        # Given 200 waiters, two on each of 100 jobs' histories, none of them grown yet
        woken = [threading.Event() for _ in range(200)]
        interests = [Interest(e.set) for e in woken]
        for i, interest in enumerate(interests):
            watch.want(interest, {keys.events(f"j{i // 2}"): "0"})
        assert watch.watched() == (100, 200)
        # When one job's history grows
        writer.xadd(keys.events("j7"), {"state": "RUNNING"})
        # Then its two waiters are woken, and no other
        assert woken[14].wait(10) and woken[15].wait(10)
        assert [i for i, e in enumerate(woken) if e.is_set()] == [14, 15]
        # And a waiter that comes after, having read less than the read saw, is woken at once
        late = threading.Event()
        watch.want(Interest(late.set), {keys.events("j7"): "0"})
        assert late.is_set()
        # And the dropped waiters leave the read: nothing is watched for them any more
        for interest in interests:
            watch.drop(interest)
        assert watch.watched() == (1, 1)
    finally:
        watch.close()
        writer.close()
