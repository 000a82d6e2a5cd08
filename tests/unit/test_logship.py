"""Reading an attempt's new output from the runtime, at once, never waiting for more."""

from __future__ import annotations

from pathlib import Path

from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.supervision import SupervisorClient


def test_process_output_reads_whole_lines_until_the_attempt_ends(tmp_path: Path) -> None:
    runtime = ProcessRuntime("n1", tmp_path, SupervisorClient(tmp_path, 1.0))
    out = tmp_path / "j.1" / "output.log"
    out.parent.mkdir()
    out.write_bytes(b"one\n\ntwo\nthr")
    # While it runs, a line without its newline waits (it may grow)
    first = runtime.read_logs("j", 1, None, ended=False)
    assert [line for _, line in first] == ["one", "", "two"]
    with out.open("ab") as f:
        f.write("ee\nlast: é".encode())
    # and the next read starts after the last line shipped
    assert [line for _, line in runtime.read_logs("j", 1, first[-1][0], ended=False)] == ["three"]
    # Once it ended, its last line comes too, and nothing after it
    rest = runtime.read_logs("j", 1, first[-1][0], ended=True)
    assert [line for _, line in rest] == ["three", "last: é"]
    assert runtime.read_logs("j", 1, rest[-1][0], ended=True) == []
    assert runtime.read_logs("gone", 1, None, ended=True) == []
