"""A raw connection to a port: what a server answers to bytes no client library would send
(a PROXY header that does not parse, or one the port does not expect)."""

from __future__ import annotations

import asyncio


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
