"""``POST /v1/jobs/{id}/stdin``: bytes for the stdin of a job submitted with ``stdin`` (``fleet run``).

The body is the bytes (at most ``MAX_CHUNK``); ``?eof=true`` ends the input after them (the job reads
EOF once it has read them). Only the user who submitted the job sends its input (another tenant's job
is a missing one), while the job is not final; input sent while it is queued waits for its attempt.
What the job is given, and what a requeued attempt sees, is :mod:`fleet.state.stdin`'s to say.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from fleet.api.commands import Commands
from fleet.api.deps import User, own_job
from fleet.errors import FleetError, Forbidden, SpecError
from fleet.models import Identity
from fleet.state.stdin import MAX_CHUNK, StdinStreams

log = logging.getLogger("fleet.api")


class StdinSent(BaseModel):
    """The bytes the job was sent so far (-1 once its input ended)."""

    sent: int


def routes(backend: Commands, streams: StdinStreams) -> APIRouter:
    router = APIRouter()

    def send(who: Identity, job_id: str, data: bytes, eof: bool) -> StdinSent:
        job = backend.get(job_id)
        own_job(who, job.spec.tenant, job_id)
        if job.owner and job.owner != who.user:
            raise Forbidden(f"job {job_id} is {job.owner}'s: only the user who submitted it sends its stdin")
        if not job.spec.stdin:
            raise SpecError(
                f"stdin: job {job_id} reads no forwarded input (its stdin is /dev/null); submit it "
                "with stdin: true (fleet run does, unless --no-stdin)"
            )
        if job.state.final:
            raise FleetError(f"job {job_id} is {job.state.value}: its stdin takes no more input")
        sent = streams.put(job_id, data, eof)
        return StdinSent(sent=-1 if eof else sent)

    @router.post("/v1/jobs/{job_id}/stdin")
    async def stdin(job_id: str, who: User, request: Request, eof: bool = Query(default=False)) -> StdinSent:
        data = b""
        async for part in request.stream():
            data += part
            if len(data) > MAX_CHUNK:
                raise SpecError(f"stdin: more than {MAX_CHUNK} bytes in one call; send it in parts")
        return await run_in_threadpool(send, who, job_id, data, eof)

    return router
