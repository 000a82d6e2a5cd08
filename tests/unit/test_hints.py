"""Hints to the controller about new jobs: what each submit names, sent by the caller or a thread."""

from __future__ import annotations

import threading

import pytest

from fleet.bus.hints import Hints
from fleet.bus.messages import CONTROLLER_QUEUE, JobSubmitted, Message, QueueLeft


class Recorded:
    """A bus that keeps what is sent; ``fail`` makes each send raise, as a bus without Redis does."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[Message] = []
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()

    def send(self, queue: str, message: Message) -> None:
        assert queue == CONTROLLER_QUEUE
        self.gate.wait(10)
        if self.fail:
            raise ConnectionError("bus down")
        self.sent.append(message)


def named(sent: list[Message]) -> list[str]:
    return [i for m in sent for i in ([m.job_id] if isinstance(m, JobSubmitted) else m.job_ids)]  # type: ignore[attr-defined]


def test_one_job_is_a_job_submitted_more_are_named_a_hundred_a_message() -> None:
    bus = Recorded()
    hints = Hints(lambda: bus)  # type: ignore[arg-type, return-value]
    hints.name(["a"])
    hints.name([f"j{i}" for i in range(250)])
    assert bus.sent[0] == JobSubmitted(job_id="a")
    assert [len(m.job_ids) for m in bus.sent[1:]] == [100, 100, 50]  # type: ignore[attr-defined]
    assert named(bus.sent) == ["a", *(f"j{i}" for i in range(250))]
    # past ten messages' worth, one resync: the controller reads the whole queue again
    hints.name([f"k{i}" for i in range(1001)])
    assert bus.sent[-1] == QueueLeft(resync=True)


def test_in_the_background_a_burst_goes_out_in_few_messages_and_close_sends_the_rest() -> None:
    bus = Recorded()
    hints = Hints(lambda: bus, background=True)  # type: ignore[arg-type, return-value]
    bus.gate.clear()  # the thread is busy sending while the submits go on
    hints.name(["first"])
    for i in range(150):
        hints.name([f"j{i}"])
    bus.gate.set()
    hints.close()
    # every job named once, in order, in far fewer messages than jobs
    assert named(bus.sent) == ["first", *(f"j{i}" for i in range(150))]
    assert len(bus.sent) <= 3
    # after close a hint is sent by the caller
    hints.name(["late"])
    assert bus.sent[-1] == JobSubmitted(job_id="late")


def test_a_failing_bus_never_fails_the_submit(caplog: pytest.LogCaptureFixture) -> None:
    for background in (False, True):
        caplog.clear()
        hints = Hints(lambda: Recorded(fail=True), background=background)  # type: ignore[arg-type, return-value]
        hints.name(["a", "b"])  # no error here: the jobs are stored, the controller finds them anyway
        hints.close()
        assert "submit_notify_failed" in caplog.text and "next periodic pass" in caplog.text
