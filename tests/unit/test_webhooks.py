"""Webhook bodies and signatures, as a receiver checks them."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from fleet.errors import SpecError
from fleet.models import Job, JobSpec, JobState, Tenant, Webhook
from fleet.webhooks import backoff, body_for, job_payload, node_payload, shown_url, sign, verify


def test_the_signature_is_the_hmac_sha256_of_the_body_as_github_signs() -> None:
    body = b'{"event":"job.ended"}'
    expected = "sha256=" + hmac.new(b"whsec_s3cret", body, hashlib.sha256).hexdigest()
    assert sign("whsec_s3cret", body) == expected
    assert verify("whsec_s3cret", body, expected)
    assert not verify("whsec_s3cret", body + b" ", expected) and not verify("other", body, expected)
    assert not verify("whsec_s3cret", body, None)


def test_a_job_end_as_json_and_as_a_slack_line() -> None:
    spec = JobSpec(name="train", command=["x"], labels={"exp": "7"}, tenant="ml")
    job = Job(
        id="train-1",
        spec=spec,
        state=JobState.FAILED,
        attempt=3,
        reason="exited with code 1; 3 of 3",
        exit_code=1,
        node="gpu-01",
    )
    payload = job_payload(job, "d-1", 100.0)
    assert payload["event"] == "job.ended" and payload["tenant"] == "ml"
    assert json.loads(body_for(payload, "json"))["job"]["labels"] == {"exp": "7"}
    assert json.loads(body_for(payload, "slack")) == {
        "text": ":x: fleet: job `train-1` (train, tenant ml) FAILED: exited with code 1; 3 of 3"
    }
    node = node_payload("gpu-01", "DOWN", "READY", "lease expired", "d-2", 100.0)
    assert (
        json.loads(body_for(node, "slack"))["text"]
        == ":computer: fleet: node `gpu-01` READY -> DOWN: lease expired"
    )


def test_urls_are_checked_and_shown_to_others_without_their_path() -> None:
    assert JobSpec(name="j", command=["x"], notify="https://h.example/x").notify == Webhook(
        url="https://h.example/x"
    )
    assert Tenant(name="t", webhook={"url": "http://h:8080/p", "format": "slack"}).webhook is not None
    for bad in ["h.example/x", "javascript:alert(1)", "https://h/ x", "https://h:port/"]:
        with pytest.raises(SpecError, match=r"notify\.url"):
            JobSpec(name="j", command=["x"], notify=bad)
    assert shown_url("https://user:pw@hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com/…"


def test_retries_back_off_exponentially_to_a_cap() -> None:
    assert [backoff(n, 5.0) for n in (1, 2, 3)] == [5.0, 10.0, 20.0] and backoff(20, 5.0) == 600.0
