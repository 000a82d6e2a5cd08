"""Telling the controller which jobs changed: a hint, never the truth (its periodic pass finds every
queued job anyway, within ``schedule_interval_s``, and freed GPUs come through the nodes-changed
feed), so whoever changed a job need not wait for it.

One job is named by a ``JobSubmitted``; more by one ``QueueLeft`` per ``MAX_NAMED`` (the controller
reads each named job again, into its queue or out of it), and past ten of those by a resync. The
API names the jobs a submit or a cancel queued or took away; an agent names the jobs whose attempts
started or ended. Both send hints from a thread of their own: a submit answers once its job is
stored, an attempt's end is not held up by the bus, and a burst (a loop of ``Client.submit``, a
node ending many short jobs) goes out as a few messages instead of one a job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fleet.bus.messages import CONTROLLER_QUEUE, MAX_NAMED, JobSubmitted, Message, QueueLeft
from fleet.log import event

if TYPE_CHECKING:
    from fleet.bus.broker import Bus

SUBMIT_LOG = logging.getLogger("fleet.api.backend")
#: a background sender sends at most once per this many seconds: a hint that follows an idle spell
#: goes at once, those of a burst (a loop of submits, a node ending many short jobs) a few together
GAP_S = 0.01
#: QueueLeft messages naming jobs one hint sends at most; more jobs ask for a resync instead
MOST_MESSAGES = 10


class Hints:
    def __init__(
        self,
        bus: Callable[[], Bus],
        background: bool = False,
        log: logging.Logger = SUBMIT_LOG,
        failed: str = "submit_notify_failed",
    ) -> None:
        """``background``: sent by a thread of this object's (started on the first hint), not by
        the caller; :meth:`close` sends what is left. A send that fails is logged to ``log`` as the
        event ``failed``."""
        self._bus, self._background, self._log, self._failed = bus, background, log, failed
        self._pending: list[str] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def name(self, job_ids: list[str]) -> None:
        if not job_ids:
            return
        if not self._background:
            self._send(job_ids)
            return
        with self._wake:
            if not self._closed:
                self._pending.extend(job_ids)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="hints", daemon=True)
                    self._thread.start()
                self._wake.notify()
                return
        self._send(job_ids)  # closed: no thread sends it any more

    def close(self) -> None:
        """Send what is pending, and end the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _take(self) -> list[str]:
        with self._wake:
            taken, self._pending = self._pending, []
        return taken

    def _run(self) -> None:
        sent_at = float("-inf")
        while True:
            with self._wake:
                self._wake.wait_for(lambda: bool(self._pending) or self._closed)
                closed = self._closed
            if not closed:  # a burst: what comes within GAP_S of the last send goes out with this
                time.sleep(max(sent_at + GAP_S - time.monotonic(), 0.0))
            self._send(self._take())
            sent_at = time.monotonic()
            if closed:
                return

    def _send(self, job_ids: list[str]) -> None:
        if not job_ids:
            return
        messages: list[Message]
        if len(job_ids) == 1:
            messages = [JobSubmitted(job_id=job_ids[0])]
        else:
            chunks = [job_ids[i : i + MAX_NAMED] for i in range(0, len(job_ids), MAX_NAMED)]
            messages = (
                [QueueLeft(job_ids=c) for c in chunks]
                if len(chunks) <= MOST_MESSAGES
                else [QueueLeft(resync=True)]
            )
        try:
            for message in messages:
                self._bus().send(CONTROLLER_QUEUE, message)
        except Exception as exc:  # a hint that fails must not fail what the job's record already holds
            named = {"job": job_ids[0]} if len(job_ids) == 1 else {"jobs": len(job_ids), "first": job_ids[0]}
            event(
                self._log,
                self._failed,
                logging.WARNING,
                **named,
                error=exc,
                effect="seen by the controller's next periodic pass",
            )
