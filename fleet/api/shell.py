"""``/v1/jobs/{id}/shell``: a WebSocket to a command inside a running job (``fleet shell``).

The caller authenticates as for every call (``Authorization: Bearer``) and may enter the jobs it may
read (``fleet show``; another tenant's job is a missing one). The exchange, once the socket is open:

- caller -> API: first a text frame, ``{"command": [...], "tty": bool, "term": "xterm", "rows": N,
  "cols": N, "rank": N}`` (``rank``: which member of a multi-node job, default 0); then binary
  frames (input bytes) and text frames ``{"eof": true}`` (input ended) and ``{"resize": [rows,
  cols]}``;
- API -> caller: binary frames, ``o`` or ``e`` then output bytes (stdout, stderr; a terminal's all
  ``o``), then one text frame: ``{"exit": CODE}``, or an error as every call answers one
  (``{"error", "detail", "exit_code"}``); then the API closes the socket.

The bytes travel to the node's agent through Redis (``fleet.state.shells``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shlex
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import Field, ValidationError
from starlette.concurrency import run_in_threadpool

from fleet.api.commands import Commands
from fleet.api.deps import NO_TOKEN, UNKNOWN_TOKEN, StrictBody, own_job
from fleet.api.limits import PerToken
from fleet.api.waiting import Waiting
from fleet.bus.messages import ShellOpen, node_queue
from fleet.errors import FleetError, SpecError, Unauthorized, error_body
from fleet.log import event
from fleet.models import Identity, Job, JobState
from fleet.state.shells import ShellRelay
from fleet.state.tokens import TokenStore

log = logging.getLogger("fleet.api")
#: how long the node's agent has to start a session
OPEN_S = 30.0
#: how often a session looks at the clock and its caller's token while no output comes
POLL_S = 5.0
#: the largest input frame (the CLI sends at most 64 KiB at a time)
MAX_FRAME = 1 << 20


class Hello(StrictBody):
    command: list[str] = Field(default_factory=list, max_length=1000)
    tty: bool = False
    term: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9._+-]*$")
    rows: int = Field(default=0, ge=0, le=10_000)
    cols: int = Field(default=0, ge=0, le=10_000)
    #: the member of a multi-node job to enter (its node's agent runs the command)
    rank: int = Field(default=0, ge=0, le=1000)


def routes(
    backend: Commands, relay: ShellRelay, tokens: TokenStore, waits: PerToken, waiting: Waiting
) -> APIRouter:
    router = APIRouter()
    router.add_api_websocket_route(
        "/v1/jobs/{job_id}/shell", Shells(backend, relay, tokens, waits, waiting).shell
    )
    return router


class Shells:
    """The sessions this API relays."""

    def __init__(
        self, backend: Commands, relay: ShellRelay, tokens: TokenStore, waits: PerToken, waiting: Waiting
    ) -> None:
        self.backend, self.relay, self.tokens, self.waits, self.waiting = (
            backend,
            relay,
            tokens,
            waits,
            waiting,
        )

    def opening(self, token: str, job_id: str) -> tuple[Identity, Job]:
        if not token:
            raise Unauthorized(NO_TOKEN)
        who = self.tokens.identify(token)
        if who is None:
            raise Unauthorized(UNKNOWN_TOKEN)
        job = self.backend.get(job_id)
        own_job(who, job.spec.tenant, job_id)
        if job.state != JobState.RUNNING or not job.nodes_held:
            raise FleetError(
                f"job {job_id} is {job.state.value}: fleet shell enters a RUNNING job "
                f"(`fleet show {job_id}` says where it stands)"
            )
        return who, job

    async def shell(self, ws: WebSocket, job_id: str) -> None:
        await ws.accept()
        scheme, _, token = ws.headers.get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        try:
            who, job = await run_in_threadpool(self.opening, token, job_id)
            hello = _hello(await _first(ws))
            _member(job, hello.rank)
            self.waits.acquire(who, f"a shell in {job_id}")
        except FleetError as exc:
            await _close(ws, error_body(exc))
            return
        except WebSocketDisconnect:
            return
        try:
            await self._session(ws, who, job, hello, token)
        finally:
            self.waits.release(who)

    async def _session(self, ws: WebSocket, who: Identity, job: Job, hello: Hello, token: str) -> None:
        session, node = secrets.token_hex(16), job.nodes_held[hello.rank]
        msg = ShellOpen(
            session=session,
            job_id=job.id,
            attempt=job.attempt,
            user=who.user,
            **hello.model_dump(exclude={"rank"}),
        )
        try:
            await run_in_threadpool(self.relay.offer, session)
            await run_in_threadpool(self.backend.bus.send, node_queue(node), msg)
        except FleetError as exc:  # Redis unreachable: said as any call says it
            await _close(ws, error_body(exc))
            return
        said = shlex.join(hello.command) or "(a shell)"
        event(
            log,
            "shell_opened",
            job=job.id,
            user=who.user,
            tenant=who.tenant,
            node=node,
            rank=hello.rank,
            session=session,
            command=said,
        )
        inward = asyncio.ensure_future(self._inward(ws, session))
        outward = asyncio.ensure_future(self._outward(ws, session, node, token))
        try:
            await asyncio.wait((inward, outward), return_when=asyncio.FIRST_COMPLETED)
        finally:
            inward.cancel()
            outward.cancel()
            await asyncio.gather(inward, outward, return_exceptions=True)
        ended = outward.result() if outward.done() and not outward.cancelled() else None
        if ended is None:  # the caller hung up: the agent hangs up the command
            await run_in_threadpool(self.relay.put, session, "in", {"close": b"1"})
        else:
            await run_in_threadpool(self.relay.drop, session)
            await _close(ws, ended)
        event(
            log,
            "shell_closed",
            job=job.id,
            user=who.user,
            session=session,
            exit_code=(ended or {}).get("exit", (ended or {}).get("exit_code", "hung up")),
        )

    async def _inward(self, ws: WebSocket, session: str) -> None:
        """The caller's input into the session's ``in`` stream, until it hangs up."""
        while True:
            got = await ws.receive()
            if got["type"] == "websocket.disconnect":
                return
            data, text = got.get("bytes"), got.get("text")
            if data is not None:
                if len(data) > MAX_FRAME:
                    return
                await run_in_threadpool(self.relay.put, session, "in", {"d": data})
            elif text is not None:
                fields = _control(text)
                if fields:
                    await run_in_threadpool(self.relay.put, session, "in", fields)

    async def _outward(self, ws: WebSocket, session: str, node: str, token: str) -> dict[str, Any]:
        """The session's output to the caller; its end (the exit, or an error) once it comes."""
        loop = asyncio.get_running_loop()
        started, deadline = False, loop.time() + OPEN_S
        stream = self.waiting.tail(
            self.relay.keys.shell(session, "out"),
            lambda after: self.relay.read(session, "out", after),
            POLL_S,
        )
        try:
            async for batch in stream:
                for _, fields in batch:
                    for kind in (b"o", b"e"):
                        if kind in fields:
                            await ws.send_bytes(kind + fields[kind])
                    if b"exit" in fields:
                        return {"exit": int(fields[b"exit"])}
                    if b"error" in fields:
                        exc = FleetError(fields[b"error"].decode(errors="replace"))
                        return {**error_body(exc), "exit_code": int(fields.get(b"exit_code", b"1"))}
                    started = started or b"started" in fields
                if not started and loop.time() > deadline:
                    exc = FleetError(
                        f"the agent of node {node} did not start the shell within {OPEN_S:.0f} s "
                        "(is it up? `fleet nodes` says)"
                    )
                    return error_body(exc)
                if not batch and await run_in_threadpool(self.tokens.identify, token) is None:
                    return error_body(Unauthorized(UNKNOWN_TOKEN))
        finally:
            await stream.aclose()
        raise AssertionError("unreachable: the stream has no end")


async def _first(ws: WebSocket) -> str:
    """The request: the first frame, JSON text, within ``OPEN_S``."""
    try:
        got = await asyncio.wait_for(ws.receive(), OPEN_S)
    except TimeoutError:
        raise SpecError(f"shell request: none came within {OPEN_S:.0f} s of the connection") from None
    if got["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(got.get("code", 1000))
    if got.get("text") is None:
        raise SpecError('shell request: send it first, as a JSON text frame ({"command": [...], ...})')
    return str(got["text"])


def _hello(text: str) -> Hello:
    try:
        return Hello.model_validate_json(text)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise SpecError(f"shell request: {fields}") from None


def _member(job: Job, rank: int) -> None:
    """A rank the job's current attempt has; :class:`SpecError` naming those it has otherwise."""
    held = len(job.nodes_held)
    if rank >= held:
        there = "rank 0 only (it runs on one node)" if held == 1 else f"ranks 0-{held - 1}"
        raise SpecError(f"rank {rank}: job {job.id} has {there}; give --rank 0 to {held - 1}")


def _control(text: str) -> dict[str, bytes | str | int] | None:
    """A control frame as an ``in`` entry (an unknown or malformed one: None, dropped)."""
    try:
        said = json.loads(text)
    except ValueError:
        return None
    if not isinstance(said, dict):
        return None
    if said.get("eof") is True:
        return {"eof": b"1"}
    size = said.get("resize")
    if (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(n, int) and 0 < n <= 10_000 for n in size)
    ):
        return {"resize": f"{size[0]} {size[1]}"}
    return None


async def _close(ws: WebSocket, said: dict[str, Any]) -> None:
    try:
        await ws.send_text(json.dumps(said))
        await ws.close()
    except (WebSocketDisconnect, RuntimeError):  # the caller is gone already
        pass
