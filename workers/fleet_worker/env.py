"""What fleet tells every attempt through its environment."""

from __future__ import annotations

import os


def job_id() -> str:
    return os.environ.get("FLEET_JOB_ID", "local")


def attempt() -> int:
    return int(os.environ.get("FLEET_ATTEMPT", "1"))
