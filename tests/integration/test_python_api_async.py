"""The asyncio Python API (fleet.aio): the same calls as Client's, awaited, against a real fleet."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path
from urllib.parse import urlparse

import pytest

import fleet
from fleet import aio
from fleet.aio import AsyncClient
from fleet.errors import JobFailed, JobTimeout, SpecError
from fleet.models import JobSpec, JobState, Node, NodeState
from tests.conftest import Api, FleetProcs
from tests.support import sh

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def ready(procs: FleetProcs, api: Api) -> Api:
    procs.one_node(api.client(), "t-aio", gpus=2)
    return api


def test_jobs_and_handles_awaited(ready: Api, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(ready.url, ready.token) as client:
            # Given jobs submitted concurrently from one event loop
            ok, bad, slow = await asyncio.gather(
                client.submit(sh("ok", "echo one; sleep 0.3; echo two"), job_id="aio-ok"),
                client.submit(sh("bad", "exit 4")),
                client.submit(sh("slow", "sleep 600")),
            )
            # Then each handle is awaited like a future
            assert (await ok.result(timeout=60)).state == JobState.SUCCEEDED and await ok.done()
            with pytest.raises(JobFailed, match="exited with code 4"):
                await bad.result(timeout=60)
            assert [line async for line in ok.follow_logs()] == ["one", "two"]
            assert await ok.logs() == "one\ntwo" and (await ok.history())[-1].state == "SUCCEEDED"
            assert (await ok.status()).exit_code == 0 and await ok.progress() is None
            assert (await client.job("aio-ok")) == ok and (await client.get("aio-ok")).id == ok.id
            assert [line.line for line in await client.logs(ok.id)] == ["one", "two"]
            assert [line.line async for line in client.follow_logs(ok.id, attempt=1)] == ["one", "two"]
            assert ok.id in [j.id for j in await client.jobs()] and ok.id in [
                j.id for j in await client.listing()
            ]
            assert (await client.wait(ok.id)).state == JobState.SUCCEEDED
            # And a batch in one call, its handles in order
            batch = await client.submit_many([sh("b0", "echo 0"), sh("b1", "echo 1")])
            assert [(await h.result(timeout=60)).state for h in batch] == [JobState.SUCCEEDED] * 2
            assert [await h.logs() for h in batch] == ["0", "1"]
            # And a job submitted with stdin reads what is sent to it, then its end
            reader = await client.submit(sh("reader", "cat", stdin=True))
            assert await client.send_stdin(reader.id, b"typed\n") == 6
            assert await client.send_stdin(reader.id, b"", eof=True) == -1
            assert (await reader.result(timeout=60)).state == JobState.SUCCEEDED
            assert await reader.logs() == "typed"
            assert (await client.history(ok.id))[0].state == "QUEUED"
            # And waiting on many: the first to finish, then each as it does
            done, pending = await aio.wait([slow, ok], timeout=30, return_when=aio.FIRST_COMPLETED)
            assert done == {ok} and pending == {slow}
            assert [h async for h in aio.as_completed([ok, bad], timeout=30)] == sorted(
                [ok, bad], key=lambda h: h.id
            )
            with pytest.raises(JobTimeout):
                await slow.wait(timeout=0.5)
            # And a follow left early frees its thread: the client still answers at once
            stream = slow.follow_logs()
            follower = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.5)
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            await stream.aclose()
            assert (await slow.cancel()).cancel_requested
            assert (await slow.wait(timeout=60)).state == JobState.CANCELLED

    asyncio.run(main())


def test_queue_arrays_nodes_tenants_tokens_and_webhooks_awaited(ready: Api, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(ready.url, ready.token, max_threads=4) as client:
            array = await client.submit_array(sh("arr", "true"), "0-1")
            assert (await array.wait(timeout=60)).tasks[JobState.SUCCEEDED] == 2
            # And holding or releasing an array whose tasks ended changes nothing, counted
            assert (await client.hold_array(array.id)).model_dump() == {
                "changed": 0,
                "already": 0,
                "not_queued": 2,
            }
            assert (await client.release_array(array.id)).not_queued == 2
            assert (await array.status()).size == 2 == (await client.array(array.id)).size
            assert (await array.task(0).result(timeout=10)).state == JobState.SUCCEEDED
            big = await client.submit(
                sh("big", "true", gpus=3, allow_unplaceable=True, labels={"exp": "big"})
            )
            for _ in range(100):
                if place := await client.position(big.id):
                    break
                await asyncio.sleep(0.1)
            assert place is not None and place.in_tenant == 1 and await client.most_gpus() == 2
            assert (await client.cancel_labels({"exp": "big"})).cancelled == [big.id]
            assert (await client.cancel(big.id)).state == JobState.CANCELLED
            waiting = await client.submit_array(sh("arr", "true", gpus=3, allow_unplaceable=True), "0-1")
            assert len((await waiting.cancel()).cancelled) == 2
            assert (await client.cancel_array(waiting.id)).already_final == 2
            (tmp_path / "p").mkdir()
            (tmp_path / "p" / "f.txt").write_text("x")
            assert (await client.upload_workdir(str(tmp_path / "p"))).startswith("sha256:")
            assert (await client.ship_workdir(str(tmp_path / "p"))).files == 1
            bundled = Path(fleet.__file__).parent / "traces" / "profiles" / "ncf"
            assert (await client.upload_profile(str(bundled))).startswith("sha256:")
            digest = "sha256:" + hashlib.sha256(b"call").hexdigest()
            assert await client.upload_blob(b"call") == digest == await client.upload_blob(b"call")
            assert client.server_version == fleet.__version__
            assert await client.quarantined_jobs() == {} and await client.quarantined_nodes() == {}
            # nodes
            assert [n.name for n in await client.nodes()] == ["t-aio"] and (await client.node("t-aio")).alive
            assert (await client.versions()).nodes == {"t-aio": fleet.__version__}
            assert (await client.cordon("t-aio")).admin_state == NodeState.CORDONED
            assert (await client.uncordon("t-aio")).admin_state == NodeState.READY
            await client.drain("t-aio", deadline_s=0, force=True)
            seen: list[list[Node]] = []
            drained = await client.wait_drained("t-aio", timeout=30, progress=seen.append)
            assert drained[0].admin_state == NodeState.DRAINED
            assert all(n[0].name == "t-aio" for n in seen)
            await client.uncordon("t-aio")
            assert (await client.redis_status()).primary == f"127.0.0.1:{urlparse(ready.redis_url).port}"
            # tenants, tokens and webhooks
            assert (await client.set_tenant("ml", max_gpus=4)).max_gpus == 4
            assert "ml" in [t.tenant.name for t in await client.tenants()]
            token, info = await client.create_token("ann", "ml")
            assert (
                info.id in [t.id for t in await client.tokens()] and (await client.whoami()).role == "admin"
            )
            assert (await client.revoke_token(info.id)).user == "ann" and token.startswith("fleet_")
            assert (await client.delete_tenant("ml")).name == "ml"
            secret = await client.webhook_secret()
            assert await client.rotate_webhook_secret() != secret and await client.webhook_deliveries() == []
            # a bad argument is the same SpecError as the Client's
            with pytest.raises(SpecError, match="limit 0"):
                await client.jobs(limit=0)
        await client.close()  # a second close is harmless

    asyncio.run(main())


def test_hold_update_release_cancel_several_requeue_and_usage_awaited(ready: Api, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(ready.url, ready.token) as client:
            # Given both GPUs busy and a job queued behind them, held and raised in priority
            busy = await client.submit(sh("busy", "sleep 600", gpus=2))
            for _ in range(600):
                if (await busy.status()).state == JobState.RUNNING:
                    break
                await asyncio.sleep(0.1)
            queued = await client.submit(sh("queued", "echo ran", gpus=1))
            assert (await client.hold(queued.id)).held_by
            assert (await client.update(queued.id, priority=5)).spec.priority == 5
            # When the busy job is cancelled: the held job waits; released, it runs
            assert (await client.cancel_jobs([busy.id])).stopping == [busy.id]
            assert (await busy.wait(timeout=60)).state == JobState.CANCELLED
            assert (await queued.status()).state == JobState.QUEUED
            assert not (await client.release(queued.id)).held_by
            assert (await queued.wait(timeout=60)).state == JobState.SUCCEEDED
            # And an array's failed task runs again once its cause is fixed
            mark = tmp_path / "fixed"
            array = await client.submit_array(
                sh("rq", f"test -e {mark} || [ $FLEET_ARRAY_INDEX -eq 0 ]"), "0-1"
            )
            assert (await array.wait(timeout=60)).tasks[JobState.FAILED] == 1
            mark.write_text("")
            assert (await client.requeue(array.id)).requeued == [f"{array.id}-1"]
            assert (await array.wait(timeout=60)).tasks[JobState.SUCCEEDED] == 2
            # And holding or releasing an array whose tasks ended changes nothing, counted
            assert (await client.hold_array(array.id)).model_dump() == {
                "changed": 0,
                "already": 0,
                "not_queued": 2,
            }
            assert (await client.release_array(array.id)).not_queued == 2
            # And the accounting counts them; a download path outside the job is refused
            counted = {r.id for r in (await client.usage(since="1h", by="job")).jobs}
            assert {busy.id, queued.id, f"{array.id}-1"} <= counted
            with pytest.raises(SpecError, match="path"):
                await client.download(queued.id, "../etc", tmp_path / "out")
            with pytest.raises(SpecError, match="path"):
                await queued.download("/etc", tmp_path / "out")

    asyncio.run(main())


def test_an_elastic_job_is_resized_awaited(api: Api) -> None:
    # Given a queued elastic job (no node: it stays queued)
    ranges = {"gpus": "1-4", "batch_size": "128-1024", "profile": "cifar10"}
    spec = JobSpec.parse({"name": "el", "command": ["python3", "t.py"], **ranges})

    async def main() -> None:
        async with AsyncClient(api.url, api.token) as client:
            job = await client.submit(spec)
            # When it is resized to 2 GPUs and batch 256
            resized = await client.resize(job.id, 2, batch_size=256)
            # Then it waits at that size, and the history says who resized it from what
            assert (resized.state, resized.num_gpus, resized.batch_size) == (JobState.QUEUED, 2, 256)
            assert any(e.reason.startswith("resized") for e in await client.history(job.id))
            with pytest.raises(SpecError, match=r"outside job .* range 1-4"):
                await client.resize(job.id, 8)

    asyncio.run(main())
