"""The real services tell systemd they are ready and keep the watchdog fed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleet import Client
from tests.conftest import FleetProcs

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


def test_agent_and_controller_send_ready_and_watchdog(
    procs: FleetProcs, client: Client, tmp_path: Path
) -> None:
    received = {}
    for name in ("controller", "agent"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / f"{name}.sock"))
        sock.settimeout(20)
        received[name] = sock
    procs.start("controller", ["controller"], NOTIFY_SOCKET=str(tmp_path / "controller.sock"))
    procs.agent("t-sd", NOTIFY_SOCKET=str(tmp_path / "agent.sock"))
    for name, sock in received.items():
        messages = [sock.recv(256).decode() for _ in range(2)]
        assert messages[0].startswith("READY=1"), name
        assert messages[1] == "WATCHDOG=1", name
        sock.close()
