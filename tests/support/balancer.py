"""An L4 load balancer on loopback that writes a PROXY protocol header first: what stands in
front of a proxy with ``security.proxy_protocol`` on (HAProxy's ``send-proxy``, an NLB's
proxy protocol). Each client connection becomes one connection to the target that opens
with ``header(client)`` and then carries the client's bytes both ways."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class HeaderBalancer:
    def __init__(self, target: str, header: Callable[[tuple[str, int]], bytes]) -> None:
        self.target = target
        self.header = header
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on a free loopback port; the address clients dial."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        host, port = self.target.rsplit(":", 1)
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port)), 10
            )
            upstream = up_writer
            up_writer.write(self.header(writer.get_extra_info("peername")[:2]))
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, TimeoutError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def first_answer(address: str, opening: bytes, timeout_s: float = 10.0) -> bytes | None:
    """Open a connection to ``address``, write ``opening``, and read until the server closes
    it: what it answered (b"" for nothing), or None if it kept the connection open."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(opening)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(), timeout_s)
        except TimeoutError:
            return None
    finally:
        writer.close()
