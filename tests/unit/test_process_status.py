"""What the process runtime reports for an attempt whose leader just exited: the window between
the leader's exit and its supervisor writing the exit file must not read as a lost attempt."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.supervisor import _created


def exited_unreaped(tmp_path: Path, supervisor: int) -> tuple[ProcessRuntime, subprocess.Popen[bytes]]:
    """An attempt folder whose leader (our child) has exited, is not reaped, and has no exit file."""
    leader = subprocess.Popen(["true"])
    while Path(f"/proc/{leader.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    folder = tmp_path / "attempts" / "job.1"
    folder.mkdir(parents=True)
    meta = {"pid": leader.pid, "created": _created(leader.pid), "supervisor": supervisor}
    (folder / "meta.json").write_text(json.dumps(meta))
    return ProcessRuntime("n", tmp_path / "attempts", supervisor=None), leader  # type: ignore[arg-type]


def test_a_leader_its_supervisor_has_not_reaped_yet_is_still_ending_not_lost(tmp_path: Path) -> None:
    runtime, leader = exited_unreaped(tmp_path, supervisor=os.getpid())  # we are its supervisor
    try:
        status = runtime.status("job", 1)
        assert status is not None and status.running  # its exit file is on the way
        (tmp_path / "attempts" / "job.1" / "exit").write_text('{"code": 3}')
        status = runtime.status("job", 1)
        assert status is not None and not status.running and status.exit is not None
        assert status.exit.code == 3 and status.exit.kind != "lost"
    finally:
        leader.wait()


def test_a_leader_whose_supervisor_is_gone_is_lost(tmp_path: Path) -> None:
    runtime, leader = exited_unreaped(tmp_path, supervisor=1)  # a zombie orphaned to init
    try:
        status = runtime.status("job", 1)
        assert status is not None and not status.running and status.exit is not None
        assert status.exit.kind == "lost" and "supervisor died" in status.exit.reason
    finally:
        leader.wait()
    # and once reaped with no exit file, it is lost whoever its supervisor was
    status = runtime.status("job", 1)
    assert status is not None and status.exit is not None and status.exit.kind == "lost"
