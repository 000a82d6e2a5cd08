"""Uploaded blobs (shipped directories, scaling profiles, functions' calls) are their tenant's: a
digest another tenant learnt or guessed reaches none of its bytes and tells nothing of them.

Every call goes over HTTP to the session's real ``fleet api`` on the real Redis; no job runs, so no
fleet is started.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

import fleet
from fleet import Client, JobState, SpecError
from tests.conftest import Api
from tests.support import sh

pytestmark = pytest.mark.integration


def blob_call(api: Api, token: str, method: str, digest: str, data: bytes | None = None) -> tuple[int, Any]:
    """The status of ``HEAD`` or ``PUT /v1/blobs/DIGEST`` as ``token``, and a PUT's answer."""
    request = urllib.request.Request(f"{api.url}/v1/blobs/{digest}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


def refusal(client: Client, spec: dict[str, Any]) -> str:
    """What a submit of ``spec`` is refused with."""
    with pytest.raises(SpecError) as refused:
        client.submit(spec)
    return str(refused.value)


def test_a_tenant_can_use_only_the_blobs_it_uploaded(api: Api, redis: redis.Redis, tmp_path: Path) -> None:
    # Given tenant a's uploads: a shipped directory, a function's call and a scaling profile
    alice, bob = (api.client(api.token_for(u, t)) for u, t in (("alice", "a"), ("bob", "b")))
    bob_token = api.token_for("bob", "b")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "secret.txt").write_text("a's code\n")
    workdir = alice.upload_workdir(str(tmp_path / "proj"))
    call_bytes = b"fleet-call 1\n{}\na's arguments"
    call = alice.upload_blob(call_bytes)
    bert = shutil.copytree(Path(fleet.__file__).parent / "traces" / "profiles" / "bert", tmp_path / "bert")
    profile = alice.upload_profile(str(bert))
    never = "sha256:" + "0" * 64
    specs = {
        "workdir": lambda d: sh("w", "true", workdir=d).model_dump(exclude_unset=True),
        "call": lambda d: {
            "name": "f",
            "command": ["python3", "-m", "fleet_worker.call", "outputs"],
            "call": {"blob": d, "function": "calc.f"},
        },
        "profile": lambda d: {
            **sh("e", "true").model_dump(exclude_unset=True),
            "gpus": {"min": 1, "max": 2},
            "batch_size": 12,
            "profile": d,
        },
    }
    theirs = {"workdir": workdir, "call": call, "profile": profile}
    # When tenant b asks whether the fleet holds them, then it is told no, as for what nobody uploaded
    for digest in (*theirs.values(), never):
        assert blob_call(api, bob_token, "HEAD", digest) == (404, None)
    # And a submit naming one is refused in the very words of one never uploaded: nothing is told
    for field, spec in specs.items():
        mine = refusal(bob, spec(theirs[field]))
        assert "not uploaded (or expired)" in mine
        assert mine.replace(theirs[field], "DIGEST") == refusal(bob, spec(never)).replace(never, "DIGEST")
    assert bob.jobs() == []
    # When tenant b uploads the same bytes itself, then they are its own upload, counted against it
    status, answer = blob_call(api, bob_token, "PUT", call, call_bytes)
    assert (status, answer["created"]) == (201, True)
    assert blob_call(api, bob_token, "HEAD", call) == (200, None)
    assert int(redis.hget("fleet:blobs:of:b", call.removeprefix("sha256:")).split()[0]) == len(call_bytes)
    # And its submit naming them is taken; tenant a's own submits were never in doubt
    assert bob.submit(specs["call"](call)).status().state == JobState.QUEUED
    assert all(alice.submit(spec(theirs[f])).status().spec.tenant == "a" for f, spec in specs.items())
    # And an upload tenant a repeats is not new to it, whoever else uploaded the same bytes
    assert blob_call(api, api.token_for("alice", "a"), "PUT", call, call_bytes)[1]["created"] is False
    # When an admin (of tenant default) submits into tenant b, then b's uploads and the admin's own
    # tenant's serve, and a's do not
    admin = api.client()
    admin.set_tenant("b")
    assert admin.submit({**specs["call"](call), "tenant": "b"}).status().spec.tenant == "b"
    with pytest.raises(SpecError, match="not uploaded"):
        admin.submit({**specs["workdir"](workdir), "tenant": "b"})
    own = admin.upload_workdir(str(tmp_path / "proj"))  # the same bytes, uploaded for tenant default
    assert admin.submit({**specs["workdir"](own), "tenant": "b"}).status().spec.tenant == "b"
