"""An attempt's working directory as the node makes it: a function's call written into it."""

from __future__ import annotations

import os
from pathlib import Path

from fleet.agent.runtime.base import CALL_FILE, LaunchSpec
from fleet.agent.runtime.workspace import make_work


def test_a_calls_bytes_are_written_where_its_runner_reads_them(tmp_path: Path) -> None:
    # Given a shipped directory that planted a link where the call goes, pointing at one of its files
    shipped = tmp_path / "shipped"
    (shipped / "out" / ".fleet-function").mkdir(parents=True)
    (shipped / "keep.txt").write_text("mine")
    (shipped / "out" / ".fleet-function" / "call").symlink_to("../../keep.txt")
    spec = LaunchSpec(
        job_id="f-1", attempt=1, image="i", command=("python3",), env={}, outputs="out", call=b"C"
    )
    # When the attempt's working directory is made
    work = make_work(tmp_path / "f-1.1", shipped, None, files=spec.work_files())
    # Then the call is a file of its own there, readable by the job alone, and nothing was written
    # through the link
    call = work / "out" / CALL_FILE
    assert call.read_bytes() == b"C" and not call.is_symlink() and oct(call.stat().st_mode & 0o777) == "0o600"
    assert (work / "keep.txt").read_text() == "mine" and (shipped / "keep.txt").read_text() == "mine"
    # And a job with no call gets nothing written
    assert LaunchSpec(job_id="j", attempt=1, image="i", command=("true",), env={}).work_files() == {}
    assert os.listdir(make_work(tmp_path / "j.1", None, None)) == []
