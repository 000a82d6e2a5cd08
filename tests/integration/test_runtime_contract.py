"""The Runtime contract (``fleet/agent/runtime/base.py``), one set of assertions for every runtime:
the in-memory fake the harness tests run on, plain processes, and Docker containers.

The fake is held to what the process and Docker runtimes do, so a test on the fake shows what a
node would do. Stopping an attempt is one contract for all three: SIGTERM to every process of its
process group at once, then SIGKILL once the grace (never rounded down) is over.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import TEST_IMAGE
from fleet.agent.runtime.base import AttemptStatus, Batched, LaunchSpec, Runtime
from fleet.agent.runtime.fake import FakeRuntime
from fleet.agent.supervision import SupervisorClient
from tests.conftest import remove_containers
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(params=["fake", "process", "docker"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    node = f"contract-{uuid.uuid4().hex[:8]}"  # Docker tests share one daemon: this node's only
    if request.param == "fake":
        yield FakeRuntime(node)
        return
    if request.param == "docker":
        request.getfixturevalue("docker_runtime")
    supervisor = SupervisorClient(tmp_path / "state", margin_s=1.0)
    supervisor.lease(time.monotonic() + 600)
    held: Runtime
    if request.param == "process":
        from fleet.agent.runtime.process import ProcessRuntime

        held = ProcessRuntime(node, tmp_path / "state" / "attempts", supervisor)
    else:
        from fleet.agent.runtime.docker import DockerRuntime

        held = DockerRuntime(node, tmp_path / "state" / "attempts", supervisor)
    try:
        yield held
    finally:
        for status in held.attempts():
            held.remove(status.job_id, status.attempt)
        supervisor.shutdown()
        held.close()
        if request.param == "docker":
            remove_containers(node)


def launch(runtime: Runtime, script: str, attempt: int = 1) -> LaunchSpec:
    spec = LaunchSpec(
        job_id=f"c{uuid.uuid4().hex[:8]}",
        attempt=attempt,
        image=TEST_IMAGE,
        command=("sh", "-c", script),
        env={},
    )
    runtime.start(spec)
    return spec


def status(runtime: Runtime, spec: LaunchSpec) -> AttemptStatus | None:
    return next((a for a in runtime.attempts() if (a.job_id, a.attempt) == (spec.job_id, spec.attempt)), None)


def ended(runtime: Runtime, spec: LaunchSpec) -> bool:
    found = status(runtime, spec)
    return found is not None and not found.running


def lines(runtime: Runtime, spec: LaunchSpec, cursor: str | None = None, done: bool = True) -> list[str]:
    return [text for _, text in runtime.read_logs(spec.job_id, spec.attempt, cursor, done)]


def test_an_attempt_runs_ends_with_its_code_told_through_watch_and_leaves_its_output(
    runtime: Runtime,
) -> None:
    exits: list[tuple[str, int]] = []
    stop = threading.Event()
    runtime.watch(lambda job_id, attempt: exits.append((job_id, attempt)), stop)
    try:
        # Given an attempt that writes two lines, works a while, and fails with 3
        spec = launch(runtime, "echo one; echo two; sleep 1; exit 3")
        # Then it is listed as running, with fleet's processes on the node
        now = status(runtime, spec)
        assert now is not None and now.running and now.exit is None
        assert runtime.pids()
        # And its end is told through watch, with its code
        wait_for(lambda: (spec.job_id, 1) in exits, what="the exit to be watched")
        wait_for(lambda: ended(runtime, spec), what="the attempt to be listed as ended")
        final = status(runtime, spec)
        assert final is not None and final.exit is not None
        assert (final.exit.code, final.exit.oom, final.exit.reason) == (3, False, "exited with code 3")
        assert not runtime.pids()
        # And its output reads in order, once, and from a cursor on
        read = runtime.read_logs(spec.job_id, 1, None, True)
        assert [text for _, text in read] == ["one", "two"]
        assert lines(runtime, spec, read[0][0]) == ["two"]
        assert lines(runtime, spec, read[-1][0]) == []
        # When it is removed, the runtime holds nothing of it
        runtime.remove(spec.job_id, 1)
        assert status(runtime, spec) is None
        assert lines(runtime, spec) == []
    finally:
        stop.set()


def test_an_exit_is_told_by_the_runtimes_watch_never_on_the_thread_reading_logs(runtime: Runtime) -> None:
    # The log shipper reads on its own thread and an exit's watcher waits for that thread to ship the
    # attempt's last lines: a watcher called on the reading thread would wait for itself
    told: list[str] = []
    stop = threading.Event()
    runtime.watch(lambda job_id, attempt: told.append(threading.current_thread().name), stop)
    try:
        spec = launch(runtime, "echo one; sleep 0.3")

        def read() -> None:
            deadline = time.monotonic() + 30
            while not told and time.monotonic() < deadline:
                runtime.read_logs(spec.job_id, spec.attempt, None, False)

        reader = threading.Thread(target=read, name="log-reader")
        reader.start()
        reader.join()
        assert told and "log-reader" not in told
    finally:
        stop.set()


def test_a_last_line_without_its_newline_comes_once_the_attempt_ended(runtime: Runtime) -> None:
    spec = launch(runtime, "echo one; printf two")
    wait_for(lambda: ended(runtime, spec), what="the attempt to end")
    assert lines(runtime, spec, done=True) == ["one", "two"]


def test_stop_sends_sigterm_and_an_attempt_that_obeys_ends_with_143(runtime: Runtime) -> None:
    spec = launch(runtime, "echo ready; sleep 30")
    wait_for(lambda: lines(runtime, spec, done=False) == ["ready"], what="the attempt to run")
    # When it is stopped with a long grace, it ends on the SIGTERM, and stop returns once it did
    runtime.stop(spec.job_id, 1, grace_s=20)
    final = status(runtime, spec)
    assert final is not None and not final.running and final.exit is not None
    assert final.exit.code == 143
    # And stopping what already ended changes nothing
    runtime.stop(spec.job_id, 1, grace_s=20)
    assert status(runtime, spec) == final


def test_stop_kills_an_attempt_that_ignores_sigterm_once_the_grace_is_over(runtime: Runtime) -> None:
    spec = launch(runtime, "trap '' TERM; echo ready; sleep 30")
    wait_for(lambda: lines(runtime, spec, done=False) == ["ready"], what="the trap to be set")
    runtime.stop(spec.job_id, 1, grace_s=1)
    final = status(runtime, spec)
    assert final is not None and final.exit is not None
    assert final.exit.code == 137  # SIGKILLed: the SIGTERM changed nothing


def test_an_attempt_that_exits_on_sigterm_ends_with_its_own_code(runtime: Runtime) -> None:
    # A job that checkpoints on SIGTERM and exits 0 (waiting in the background, as such scripts do)
    spec = launch(runtime, "trap 'exit 7' TERM; echo ready; sleep 30 & wait")
    wait_for(lambda: lines(runtime, spec, done=False) == ["ready"], what="the trap to be set")
    runtime.stop(spec.job_id, 1, grace_s=20)
    final = status(runtime, spec)
    assert final is not None and final.exit is not None
    assert final.exit.code == 7


def test_sigterm_reaches_the_foreground_command_too_so_a_trap_runs_at_once(runtime: Runtime) -> None:
    # Given a shell that traps SIGTERM while a command runs in its foreground (sh runs a trap only
    # once that command has ended); the command itself says it runs, so the SIGTERM cannot come
    # before it exists (a shell's ``echo ready; sleep 30`` is not yet sleeping when it has echoed)
    spec = launch(runtime, "trap 'exit 7' TERM; sh -c 'echo ready; exec sleep 30'")
    wait_for(lambda: lines(runtime, spec, done=False) == ["ready"], what="the foreground command to run")
    # When it is stopped with a long grace
    runtime.stop(spec.job_id, 1, grace_s=20)
    # Then the foreground command got the SIGTERM as well, ended on it, and the trap ran at once
    final = status(runtime, spec)
    assert final is not None and final.exit is not None
    assert final.exit.code == 7


def test_a_process_behind_a_wrapper_shell_gets_sigterm_and_checkpoints(runtime: Runtime) -> None:
    # Given a job whose checkpointing process runs behind a wrapper shell (a launcher script) that
    # waits for it on SIGTERM and then exits with a code of its own
    inner = 'trap "echo checkpointed; exit 0" TERM; echo ready; sleep 30 & wait'
    spec = launch(runtime, f"trap 'exit 5' TERM; sh -c '{inner}'")
    wait_for(lambda: lines(runtime, spec, done=False) == ["ready"], what="the inner process to run")
    # When it is stopped
    runtime.stop(spec.job_id, 1, grace_s=20)
    # Then the inner process got the SIGTERM and checkpointed, and the wrapper exited after it
    final = status(runtime, spec)
    assert final is not None and final.exit is not None
    assert final.exit.code == 5
    assert lines(runtime, spec) == ["ready", "checkpointed"]


def test_a_grace_under_a_second_is_honoured_not_rounded_down(runtime: Runtime) -> None:
    # Given a job that needs a fraction of a second to checkpoint on SIGTERM
    spec = launch(runtime, "trap 'sleep 0.2; echo checkpointed; exit 5' TERM; echo ready; sleep 30 & wait")
    wait_for(lambda: lines(runtime, spec, done=False) == ["ready"], what="the job to run")
    # When it is stopped with a grace of under a second, more than the checkpoint takes
    runtime.stop(spec.job_id, 1, grace_s=0.9)
    # Then it checkpointed and exited with its own code: it was not SIGKILLed at once
    final = status(runtime, spec)
    assert final is not None and final.exit is not None
    assert final.exit.code == 5
    assert lines(runtime, spec) == ["ready", "checkpointed"]


def test_starting_an_attempt_again_neither_restarts_nor_duplicates_it(runtime: Runtime) -> None:
    # Given an attempt that ran and ended
    spec = launch(runtime, "echo once; exit 5")
    wait_for(lambda: ended(runtime, spec), what="the attempt to end")
    first = status(runtime, spec)
    # When the same attempt is started again (a duplicated launch message)
    runtime.start(spec)
    # Then it is not run again: one attempt, its exit and output as they were
    assert [a for a in runtime.attempts() if a.job_id == spec.job_id] == [first]
    assert lines(runtime, spec) == ["once"]
    # And a running one started again keeps running, once
    running = launch(runtime, "echo up; sleep 30", attempt=2)
    runtime.start(running)
    assert [a.running for a in runtime.attempts() if a.job_id == running.job_id] == [True]
    wait_for(lambda: lines(runtime, running, done=False) == ["up"], what="its output")


def test_what_an_attempt_leaves_in_its_outputs_is_on_the_host_until_it_is_removed(runtime: Runtime) -> None:
    if runtime.name == "fake":
        pytest.skip("the fake runs no command: it has no working directory")
    # Given an attempt that writes outputs/ in its working directory (a container: its image's, /)
    spec = launch(runtime, "mkdir -p outputs/sub && echo kept > outputs/sub/r.txt")
    wait_for(lambda: ended(runtime, spec), what="the attempt to end")
    # Then, once it ended, what it wrote is in its working directory on this host, where the agent
    # keeps it from
    work = runtime.work_dir(spec.job_id, 1)
    assert work is not None and (work / "outputs" / "sub" / "r.txt").read_text() == "kept\n"
    # and once it is removed, nothing of it is left there
    runtime.remove(spec.job_id, 1)
    assert not work.exists() and runtime.work_dir(spec.job_id, 1) in (None, work)


def test_an_elastic_attempt_is_told_a_new_batch_while_it_runs(runtime: Runtime) -> None:
    assert isinstance(runtime, Batched)
    # Given an elastic job's attempt at batch 64 that waits to be told batch 512, as it reads its batch
    told = '"$FLEET_CONTROL_DIR/batch_size"'
    waits = f"until grep -qx 512 {told}; do sleep 0.05; done; echo told $(cat {told})"
    spec = LaunchSpec(
        job_id=f"c{uuid.uuid4().hex[:8]}",
        attempt=1,
        image=TEST_IMAGE,
        command=("sh", "-c", "sleep 30" if runtime.name == "fake" else waits),
        env={},
        batch_size=64,
        control=True,
    )
    runtime.start(spec)
    assert runtime.batch_of(spec.job_id, 1) == 64
    # When it is told batch 512
    assert runtime.set_batch(spec.job_id, 1, 512)
    # Then it reads 512, where it runs (the fake runs no command: it only keeps what it was told)
    assert runtime.batch_of(spec.job_id, 1) == 512
    if runtime.name != "fake":
        wait_for(lambda: ended(runtime, spec), timeout=30, what="the attempt to see its new batch")
        assert lines(runtime, spec) == ["told 512"]
    # And an attempt that is not elastic has nothing to be told
    plain = launch(runtime, "sleep 30", attempt=2)
    assert runtime.batch_of(plain.job_id, 2) is None and not runtime.set_batch(plain.job_id, 2, 512)


@pytest.mark.parametrize("runtime", ["docker"], indirect=True)
def test_a_container_removed_while_docker_lists_them_is_left_out(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two ended attempts, and Docker's list taken while both existed
    kept, gone = launch(runtime, "true"), launch(runtime, "true")
    wait_for(lambda: ended(runtime, kept) and ended(runtime, gone), what="both attempts to end")
    client = runtime.client  # type: ignore[attr-defined]
    listing = client.api.containers(all=True, filters=runtime._filters())  # type: ignore[attr-defined]
    assert len(listing) == 2
    # When one is removed before Docker inspects what it listed (another thread's end of it)
    runtime.remove(gone.job_id, gone.attempt)
    monkeypatch.setattr(client.api, "containers", lambda *args, **kwargs: listing)
    # Then the runtime lists the other, with no error for the one gone (it ended the exit thread)
    assert [(a.job_id, a.running) for a in runtime.attempts()] == [(kept.job_id, False)]
    assert status(runtime, gone) is None and not runtime.pids()
