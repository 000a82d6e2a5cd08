"""systemd's notify protocol: READY=1, WATCHDOG=1, STOPPING=1 as datagrams to $NOTIFY_SOCKET.

A no-op when not started by systemd (no NOTIFY_SOCKET), so services call it unconditionally.
"""

from __future__ import annotations

import contextlib
import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        # the services ping the watchdog on every loop iteration (<= 2 s), well inside WatchdogSec
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")

    def _send(self, message: str) -> None:
        if not self.address:
            return
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        # systemd gone or its socket unreachable: never fail a service for it
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
            sock.sendto(message.encode(), target)

    def ready(self, status: str = "") -> None:
        self._send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")
