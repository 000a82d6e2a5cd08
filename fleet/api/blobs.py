"""``/v1/blobs``: what jobs take along, named by the SHA-256 of its bytes: shipped directories
(``--workdir``, a tar.gz), scaling profiles (``--profile ./dir``, JSON) and functions' calls. Each
tenant sees and uses only what it uploaded itself (:mod:`fleet.state.blobs`)."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response

from fleet.api.deps import User
from fleet.config import Settings
from fleet.errors import SpecError
from fleet.models import WorkdirSize
from fleet.state.blobs import BlobStore
from fleet.workdir import check_archive, check_digest, digest_of

#: how a gzip stream starts (a packed directory; profiles are JSON)
GZIP = b"\x1f\x8b"


def routes(blobs: BlobStore, settings: Settings) -> APIRouter:
    router = APIRouter()

    @router.head("/v1/blobs/{digest}")
    def blob_exists(digest: str, who: User) -> Response:
        """200 when the fleet holds it for the caller's tenant, which uploaded it (and keeps it
        another ``workdir_retention_s``), else 404: what other tenants uploaded is never told."""
        return Response(status_code=200 if blobs.use(digest, [who.tenant]) else 404)

    @router.put("/v1/blobs/{digest}", status_code=201)
    async def blob_put(digest: str, request: Request, who: User) -> dict[str, Any]:
        """A packed directory (tar.gz) or a scaling profile (JSON) named by the SHA-256 of its bytes, at
        most ``workdir_max_bytes``, uploaded for the caller's tenant (``created``: the tenant had not
        uploaded it already)."""
        check_digest(digest)
        limit = settings.workdir_max_bytes
        declared = int(request.headers.get("content-length") or 0)
        if declared > limit:
            raise SpecError(
                f"workdir: {declared} bytes packed, more than workdir_max_bytes ({limit}); leave "
                "data, checkpoints and environments out with a .fleetignore"
            )
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise SpecError(f"workdir: more than workdir_max_bytes ({limit}) packed")
        if digest_of(bytes(data)) != digest:
            raise SpecError(f"workdir: the bytes sent do not hash to {digest}")
        size = None
        if data.startswith(GZIP):  # a packed directory (a profile is JSON): bounded before a node unpacks it
            content, files = await anyio.to_thread.run_sync(check_archive, bytes(data), limit)
            size = WorkdirSize(packed=len(data), bytes=content, files=files)
        created = await anyio.to_thread.run_sync(
            blobs.put, digest, bytes(data), who.tenant, settings.blob_quota_bytes, size
        )
        return {"digest": digest, "bytes": len(data), "created": created}

    return router
