"""The API refuses a body before it reads it: no token, no body read; no body over its limit.

A 300 MB POST with no token used to be read and parsed whole (the API went from 68 MB to 874 MB)
before the token was checked.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import pytest

from fleet import Client, JobSpec
from fleet.config import load_settings
from fleet.errors import JobTimeout, SpecError, TooManyRequests
from fleet.keys import Keys
from fleet.models import Role
from fleet.ops.local import free_port
from fleet.state import connect
from fleet.state.tokens import TokenStore
from tests.support import wait_for

pytestmark = pytest.mark.integration
MB = 1 << 20


@dataclass
class OwnApi:
    port: int
    proc: subprocess.Popen[bytes]
    token: str

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)


@pytest.fixture
def own_api(redis_url: str) -> Iterator[OwnApi]:
    yield from _start_api(redis_url)


def _start_api(redis_server: str, **env: str) -> Iterator[OwnApi]:
    port = free_port()
    argv = [sys.executable, "-m", "fleet", "api", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(
        argv, env={**os.environ, "FLEET_REDIS_URL": redis_server, **env}, stdin=subprocess.DEVNULL
    )
    redis = connect(load_settings(redis_url=redis_server))
    token, _ = TokenStore(redis, Keys()).create("alice", "default", Role.USER)
    redis.close()
    wait_for(lambda: _listens(port), timeout=30, what="fleet api listening")
    yield OwnApi(port, proc, token)
    proc.terminate()
    proc.wait(timeout=10)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def post(port: int, size: int, token: str | None, chunked: bool = False) -> tuple[int, dict[str, object]]:
    """POST a ``size``-byte body to /v1/jobs, as far as the server reads it; its status and answer."""
    head = ["POST /v1/jobs HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    if token:
        head.append(f"Authorization: Bearer {token}")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        block, sent = b"x" * MB, 0
        try:
            while sent < size:
                part = block[: min(MB, size - sent)]
                sock.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part)
                sent += len(part)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what it refused to read
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1])


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 1 << 30


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_a_huge_body_without_a_token_is_refused_unread(own_api: OwnApi, chunked: bool) -> None:
    before = own_api.rss()
    # When a caller with no token, then one with a made-up token, POSTs 200 MB
    for token in (None, "fleet_000000000000_" + "a" * 43):
        status, body = post(own_api.port, 200 * MB, token, chunked)
        # Then each is refused as unauthenticated, and the API never held the body
        assert (status, body["error"]) == (401, "Unauthorized"), body
    assert own_api.rss() - before < 30 * MB
    # And the API serves on
    with Client(f"http://127.0.0.1:{own_api.port}", own_api.token) as client:
        assert client.whoami().user == "alice"


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_a_body_over_the_limit_is_refused_naming_the_setting(own_api: OwnApi, chunked: bool) -> None:
    before = own_api.rss()
    status, body = post(own_api.port, 50 * MB, own_api.token, chunked)
    assert status == 413 and "api.max_body_bytes" in str(body["detail"]), body
    assert own_api.rss() - before < 30 * MB
    # while a spec of ordinary size goes through
    client = Client(f"http://127.0.0.1:{own_api.port}", own_api.token)
    job = client.submit(JobSpec(name="ok", command=["true"], env={f"K{i}": "x" * 30_000 for i in range(4)}))
    assert client.get(job.id).spec.env["K3"] == "x" * 30_000
    client.close()


def test_a_tenant_at_its_upload_quota_is_refused_not_the_fleet(redis_url: str) -> None:
    # Given an API allowing each tenant 3 MiB of uploads, kept 3 s (on an empty Redis: no uploads of
    # earlier tests' count)
    gen = _start_api(redis_url, FLEET_BLOB_QUOTA_BYTES=str(3 * MB), FLEET_WORKDIR_RETENTION_S="3")
    api = next(gen)
    redis = connect(load_settings(redis_url=redis_url))
    other, _ = TokenStore(redis, Keys()).create("bob", "other", Role.USER)
    redis.close()
    alice = Client(f"http://127.0.0.1:{api.port}", api.token)
    bob = Client(f"http://127.0.0.1:{api.port}", other)
    try:
        # When alice uploads three 1 MiB blobs, then a fourth
        for i in range(3):
            alice.upload_blob(bytes([i]) * MB)
        # Then the fourth is refused, saying what she holds and the quota
        with pytest.raises(
            SpecError, match=r"tenant 'default' holds 3145728 bytes .* blob_quota_bytes \(3145728\)"
        ):
            alice.upload_blob(b"x" * MB)
        # And another tenant uploads as before
        assert bob.upload_blob(b"y" * MB).startswith("sha256:")
        # And once her uploads expire, she may upload again
        time.sleep(3.5)
        assert alice.upload_blob(b"x" * MB).startswith("sha256:")
    finally:
        alice.close()
        bob.close()
        next(gen, None)


def test_one_token_cannot_take_every_wait_from_the_rest(redis_url: str) -> None:
    # Given an API allowing each token 4 blocking calls, and a job that stays queued (an empty Redis:
    # no node an earlier test registered, so no GPU it could run on)
    gen = _start_api(redis_url, FLEET_API__MAX_WAITS_PER_TOKEN="4")
    api = next(gen)
    redis = connect(load_settings(redis_url=redis_url))
    other, _ = TokenStore(redis, Keys()).create("bob", "default", Role.USER)
    redis.close()
    url = f"http://127.0.0.1:{api.port}"
    alice = [Client(url, api.token) for _ in range(6)]
    bob = Client(url, other)
    try:
        job = alice[0].submit(JobSpec(name="queued", gpus=1, command=["true"]))
        path = f"/v1/jobs/{job.id}/wait"
        # When alice holds 4 waits of 5 s each
        with ThreadPoolExecutor(4) as pool:
            held = [pool.submit(_held_wait, c, path) for c in alice[:4]]
            # Then once the API holds them, her fifth blocking call, a wait or a log follow, is refused
            # at once (429): asked with a short wait until the four are in
            refused = _refused(alice[4], path)
            assert "api.max_waits_per_token" in str(refused)
            with pytest.raises(TooManyRequests):
                next(alice[5].follow_logs(job.id))
            # while bob's wait is served as ever
            assert bob._call("GET", path, query={"timeout_s": "0.1"})["id"] == job.id
            assert [f.result()["state"] for f in held] == ["QUEUED"] * 4
        # And once hers end she waits again; Client.wait itself looks instead of failing when full
        assert alice[4]._call("GET", path, query={"timeout_s": "0.1"})["state"] == "QUEUED"
        with pytest.raises(JobTimeout):
            alice[5].wait(job.id, timeout=1)
    finally:
        for client in (*alice, bob):
            client.close()
        next(gen, None)


def _held_wait(client: Client, path: str) -> dict[str, object]:
    """A 5 s wait on a thread of its own (a client's connections belong to the thread that made them),
    asked again while the probe in the test holds the token's last slot."""
    try:
        while True:
            try:
                answer: dict[str, object] = client._call("GET", path, query={"timeout_s": "5"})
                return answer
            except TooManyRequests:
                time.sleep(0.01)
    finally:
        client.close()


def _refused(client: Client, path: str, timeout: float = 10) -> TooManyRequests:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client._call("GET", path, query={"timeout_s": "0.05"})
        except TooManyRequests as exc:
            return exc
    raise AssertionError(f"no wait refused within {timeout} s")
