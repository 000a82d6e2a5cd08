"""The node's log shipper over an in-memory runtime and store: rounds, last lines, failures."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleet.agent.logship import LogShipper
from fleet.agent.runtime.process import ProcessRuntime
from fleet.agent.supervision import SupervisorClient
from fleet.errors import StoreUnavailable
from fleet.models import Progress

Key = tuple[str, int]
Stream = tuple[str, int, int]


class FakeRuntime:
    """Each attempt's output as lines; a cursor is the number of lines before it."""

    def __init__(self) -> None:
        self.lines: dict[Key, list[str]] = {}
        self.partial: dict[Key, str] = {}  # a last line without its newline (yet)
        self.broken: set[Key] = set()
        self.reads = 0

    def read_logs(self, job_id: str, attempt: int, cursor: str | None, ended: bool) -> list[tuple[str, str]]:
        self.reads += 1
        key = (job_id, attempt)
        if key in self.broken:
            raise OSError("disk on fire")
        lines = self.lines.get(key, []) + ([self.partial[key]] if ended and key in self.partial else [])
        start = int(cursor or 0)
        return [(str(i + 1), line) for i, line in enumerate(lines) if i >= start]


class FakeStore:
    """``JobStore``'s two log calls, over dicts; ``down`` calls fail as an unreachable Redis does."""

    def __init__(self) -> None:
        self.streams: dict[Key, list[tuple[str, str]]] = {}
        self.appends = 0
        self.down = 0
        self.progress: dict[Key, Progress] = {}
        self.caps: dict[Stream, int] = {}

    def _call(self) -> None:
        if self.down:
            self.down -= 1
            raise StoreUnavailable("redis unavailable: connection refused")

    def append_logs_many(
        self,
        batches: Mapping[Stream, Sequence[tuple[str, str]]],
        max_lines: int,
        progress: Mapping[Key, Progress] | None = None,
        caps: Mapping[Stream, int] | None = None,
    ) -> None:
        self.caps.update(caps or {})
        self._call()
        self.appends += 1
        self.progress.update(progress or {})
        for (job_id, attempt, rank), lines in batches.items():
            assert rank == 0
            self.streams.setdefault((job_id, attempt), []).extend(lines)

    def last_log_cursors(self, streams: Sequence[Stream]) -> list[str | None]:
        self._call()
        keys = [(job_id, attempt) for job_id, attempt, _ in streams]
        return [self.streams[k][-1][0] if self.streams.get(k) else None for k in keys]

    def text(self, key: Key) -> list[str]:
        return [line for _, line in self.streams.get(key, [])]


@pytest.fixture
def parts() -> Iterator[tuple[FakeRuntime, FakeStore, LogShipper]]:
    runtime, store, stop = FakeRuntime(), FakeStore(), threading.Event()
    shipper = LogShipper(runtime, store, 1000, 0.05, stop)  # type: ignore[arg-type]
    yield runtime, store, shipper
    stop.set()
    shipper.close()


def test_a_round_ships_every_attempts_new_lines_in_one_append(parts: Any) -> None:
    runtime, store, shipper = parts
    runtime.lines = {("a", 1): ["a1", "a2"], ("b", 1): ["b1"], ("c", 2): []}
    for key in runtime.lines:
        shipper.follow(*key)
    shipper.ship_logs()
    runtime.lines[("a", 1)].append("a3")
    runtime.lines[("c", 2)].append("c1")
    shipper.ship_logs()
    shipper.ship_logs()  # nothing new: no append
    assert store.appends == 2
    assert store.text(("a", 1)) == ["a1", "a2", "a3"]
    assert store.text(("b", 1)) == ["b1"] and store.text(("c", 2)) == ["c1"]


def test_each_attempts_newest_progress_report_of_a_round_is_kept_in_the_same_append(parts: Any) -> None:
    runtime, store, shipper = parts
    # Given an attempt printing three reports (one unreadable) and another printing none
    runtime.lines = {
        ("a", 1): [
            'fleet-progress {"step": 1, "at": 5}',
            'fleet-progress {"step": 2, "total": 4, "at": 6}',
            "fleet-progress {broken",
            "chatter",
        ],
        ("b", 1): ["no report"],
    }
    for key in runtime.lines:
        shipper.follow(*key)
    shipper.ship_logs()
    # Then only the newest readable one is kept, in the round's one append
    assert store.appends == 1 and store.progress == {("a", 1): Progress(step=2, total=4, at=6.0)}


def test_a_restarted_shipper_resumes_after_the_last_stored_line(parts: Any) -> None:
    runtime, store, shipper = parts
    store.streams[("a", 1)] = [("1", "a1"), ("2", "a2")]  # shipped before an agent restart
    runtime.lines[("a", 1)] = ["a1", "a2", "a3"]
    shipper.follow("a", 1)
    shipper.ship_logs()
    assert store.text(("a", 1)) == ["a1", "a2", "a3"]


def test_while_redis_is_down_lines_wait_and_none_is_lost_or_doubled(parts: Any) -> None:
    runtime, store, shipper = parts
    runtime.lines[("a", 1)] = ["a1"]
    shipper.follow("a", 1)
    shipper.ship_logs()
    runtime.lines[("a", 1)] += ["a2", "a3"]
    store.down = 3  # the next three calls fail; the round retries with backoff
    shipper.ship_logs()
    assert store.text(("a", 1)) == ["a1", "a2", "a3"]


def test_a_broken_read_is_logged_once_and_the_others_still_ship(
    parts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, store, shipper = parts
    runtime.lines = {("a", 1): ["a1"], ("b", 1): ["b1"]}
    runtime.broken.add(("a", 1))
    shipper.follow("a", 1)
    shipper.follow("b", 1)
    with caplog.at_level(logging.WARNING, "fleet.agent.logs"):
        shipper.ship_logs()
        shipper.ship_logs()
    assert store.text(("b", 1)) == ["b1"] and store.text(("a", 1)) == []
    assert caplog.text.count("log_read_failing") == 1
    runtime.broken.clear()
    shipper.ship_logs()
    assert store.text(("a", 1)) == ["a1"]


def test_finish_ships_the_last_line_without_newline_then_lets_the_attempt_go(parts: Any) -> None:
    runtime, store, shipper = parts
    runtime.lines[("a", 1)] = ["a1"]
    runtime.partial[("a", 1)] = "no newline"
    shipper.start()
    shipper.follow("a", 1)
    assert shipper.finish("a", 1, timeout=5)
    assert store.text(("a", 1)) == ["a1", "no newline"]
    assert shipper.following() == set()


def test_finish_of_an_attempt_that_ended_unfollowed_ships_after_the_stored_cursor(parts: Any) -> None:
    runtime, store, shipper = parts
    store.streams[("a", 1)] = [("1", "a1")]  # shipped before the agent went down; it ended meanwhile
    runtime.lines[("a", 1)] = ["a1", "a2"]
    runtime.partial[("a", 1)] = "end"
    shipper.start()
    assert shipper.finish("a", 1, timeout=5)
    assert store.text(("a", 1)) == ["a1", "a2", "end"]


def test_an_idle_shipper_reads_nothing_and_calls_no_one(parts: Any) -> None:
    runtime, store, shipper = parts
    runtime.lines[("a", 1)] = ["a1"]
    shipper.start()
    shipper.follow("a", 1)
    assert shipper.finish("a", 1, timeout=5)
    reads, appends = runtime.reads, store.appends
    time.sleep(0.3)  # six intervals
    assert (runtime.reads, store.appends) == (reads, appends)


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


def test_long_lines_are_cut_saying_so_and_long_output_keeps_fewer_lines() -> None:
    runtime, store, stop = FakeRuntime(), FakeStore(), threading.Event()
    shipper = LogShipper(runtime, store, 1000, 0.05, stop, max_line_bytes=1024, max_bytes=64 << 10)  # type: ignore[arg-type]
    # Given a job printing a short line, a 1 MiB line and a line of many-byte characters
    runtime.lines = {("a", 1): ["short", "x" * (1 << 20), "é" * 1000]}
    shipper.follow("a", 1)
    shipper.ship_logs()
    short, long, wide = store.text(("a", 1))
    # Then the long ones are cut at 1 KiB (never inside a character), saying how much went
    assert short == "short"
    assert long == "x" * 1024 + f" … [{(1 << 20) - 1024} more bytes cut: log_max_line_bytes]"
    assert wide.startswith("é" * 512 + " … [976 more bytes cut")
    # And the stream keeps ~64 KiB of such lines, not 1,000 of them
    assert store.caps[("a", 1, 0)] == int((64 << 10) / ((5 + len(long) + len(wide)) / 3))
    stop.set()
    shipper.close()
