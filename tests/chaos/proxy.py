"""TCP forwarders the failover test can cut: one in front of each Redis, the only address the
replicas, the sentinels and the services know it by (``replica-announce-port``).

A cut is a network partition, not a crash: connections stay open and nothing passes either way
(bytes already sent wait, as TCP retransmits them), new connections are accepted and held; when the
cut heals, all of it flows again, to a Redis that may have been demoted meanwhile. This is what a
firewall rule dropping packets does, without changing the host's firewall (the test runs beside
others, as any user, in CI) or needing root for a network namespace. SIGSTOP of the Redis would
not do: a stopped primary takes no writes, and one cut off by a network goes on taking them from
whoever still reaches it (or reaches it again before the sentinels demote it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Forwarders:
    """Forwarders to ports of 127.0.0.1, all on one event loop in a thread of their own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="forwarders", daemon=True)
        self._thread.start()
        self._open: dict[int, asyncio.Event] = {}  # front port -> set while not cut
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()  # every connection's ends, closed at close()

    def front(self, target: int) -> int:
        """Start forwarding a free port to ``target``; that port."""
        return self._run(self._serve(target))

    def cut(self, front: int) -> None:
        self.loop.call_soon_threadsafe(self._open[front].clear)

    def heal(self, front: int) -> None:
        self.loop.call_soon_threadsafe(self._open[front].set)

    def close(self) -> None:
        """Stop the forwarders and close every connection here, before the loop stops: a
        transport left open is found by the garbage collector later, as a ResourceWarning in
        whichever test then runs in this process."""

        async def stop() -> None:
            for server in self._servers:
                server.close()
            for gate in self._open.values():
                gate.set()  # nothing waits on a cut any more
            # a connection accepted just now is a transport, then its callback's task: let them run
            # their first steps (each registers its ends here) before anything is cancelled
            await asyncio.sleep(0.05)
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in self._writers:
                writer.transport.abort()
            await asyncio.sleep(0.05)  # the aborted transports' connection_lost callbacks close them

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _serve(self, target: int) -> int:
        gate = asyncio.Event()
        gate.set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.add(writer)
            try:
                await gate.wait()  # a connection opened across a cut waits, as a SYN retransmitted
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
            except OSError:  # the Redis is down: the connection is refused, as it would be
                writer.close()
                return
            self._writers.add(up_writer)
            await asyncio.gather(_pump(reader, up_writer, gate), _pump(up_reader, writer, gate))

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self._servers.append(server)
        port = int(server.sockets[0].getsockname()[1])
        self._open[port] = gate
        return port


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, gate: asyncio.Event) -> None:
    """Bytes from ``source`` to ``sink`` while the gate is open; either end closing closes both."""
    try:
        while data := await source.read(65536):
            await gate.wait()
            sink.write(data)
            await sink.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.close()  # the other pump then reads its end's close
