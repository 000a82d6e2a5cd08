"""The caller's end of ``/v1/jobs/{id}/shell`` (``fleet shell``): a command inside a running job,
its input and output relayed over a WebSocket (the exchange is described in ``fleet.api.shell``)."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Iterator, Sequence
from urllib.parse import quote

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from fleet.client.credentials import resolve
from fleet.client.transport import error_named
from fleet.errors import ApiUnavailable, FleetError

#: how long opening the socket may take
OPEN_S = 30.0


class ShellSession:
    """An open session: ``send`` input, ``output()`` as it comes; ``exit_code`` once it ended."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.exit_code: int | None = None

    def send(self, data: bytes) -> None:
        self.conn.send(data)

    def eof(self) -> None:
        """The input ended (a script's stdin): the command reads end of file."""
        self.conn.send(json.dumps({"eof": True}))

    def resize(self, rows: int, cols: int) -> None:
        self.conn.send(json.dumps({"resize": [rows, cols]}))

    def output(self) -> Iterator[tuple[str, bytes]]:
        """``("o", bytes)`` (stdout) and ``("e", bytes)`` (stderr) as they come, until the command
        exits (then ``exit_code`` holds its code); the error the API or the node names, raised."""
        try:
            for frame in self.conn:
                if isinstance(frame, bytes):
                    yield frame[:1].decode(), frame[1:]
                    continue
                said = json.loads(frame)
                if "exit" in said:
                    self.exit_code = int(said["exit"])
                    return
                error = error_named(str(said.get("error")), str(said.get("detail")))
                if type(error) is FleetError:  # a refusal of the node's: the code it gave
                    error.exit_code = int(said.get("exit_code", 1))
                raise error
        except ConnectionClosed:
            pass
        raise ApiUnavailable("the fleet API closed the shell before the command ended")

    def close(self) -> None:
        self.conn.close()


def open_shell(
    job_id: str,
    command: Sequence[str] = (),
    *,
    tty: bool = False,
    term: str = "",
    size: tuple[int, int] | None = None,
    url: str | None = None,
    token: str | None = None,
    ca_file: str | None = None,
    rank: int = 0,
) -> ShellSession:
    """Run ``command`` (none: a shell) in the running job ``job_id``, as the job's user in its
    directory and environment; ``tty``: on a terminal of its own (``size``: rows, columns);
    ``rank``: in that member of a multi-node job (a rank it does not have is refused)."""
    creds = resolve(url, token, ca_file)
    parts = creds.parts
    scheme = "wss" if parts.scheme == "https" else "ws"
    address = f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/v1/jobs/{quote(job_id, safe='')}/shell"
    context = ssl.create_default_context(cafile=creds.ca_file) if scheme == "wss" else None
    try:
        conn = connect(
            address,
            additional_headers={"Authorization": f"Bearer {creds.token}"},
            ssl=context,
            open_timeout=OPEN_S,
            max_size=8 << 20,
        )
    except InvalidStatus as exc:
        raise ApiUnavailable(
            f"fleet API at {creds.url} refused the shell (HTTP {exc.response.status_code}): is it "
            "older than fleet shell, or behind a proxy that does not pass WebSockets?"
        ) from None
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        raise ApiUnavailable(f"fleet API at {creds.url} unreachable: {exc}") from None
    rows, cols = size or (0, 0)
    hello = {"command": list(command), "tty": tty, "term": term, "rows": rows, "cols": cols}
    if rank:  # only when asked: an API older than ranks refuses the field
        hello["rank"] = rank
    with contextlib.suppress(ConnectionClosed):  # refused unread: output() raises the refusal
        conn.send(json.dumps(hello))
    return ShellSession(conn)
