"""The TLS front (proxy/security/front.py) over real loopback sockets: each connection goes
to the port its first byte names, bytes pass both ways unchanged, a kind the mode does not
take is closed with a line that says why, and either end closing closes the other."""

from __future__ import annotations

import asyncio
import logging

import pytest

from proxy.api.connections import grpc_peer
from proxy.security.front import TlsFront, Transport
from testkit.waits import wait_until

TLS_HELLO = bytes([0x16, 0x03, 0x01, 0x00, 0x05]) + b"hello"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Upstream:
    """A stand-in for one of the gRPC server's loopback ports: answers each chunk with its
    name and the chunk, and keeps the peers it saw."""

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.peers: list[tuple[str, int]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.peers.append(writer.get_extra_info("peername"))
        self.writers.append(writer)
        while data := await reader.read(65536):
            writer.write(self.name + b":" + data)
            await writer.drain()
        writer.close()

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def upstreams():
    plain, tls = Upstream(b"plain"), Upstream(b"tls")
    await plain.start()
    await tls.start()
    yield plain, tls
    await plain.close()
    await tls.close()


async def _front(ports: dict[Transport, int | None], **kw) -> tuple[TlsFront, int]:
    front = TlsFront(
        ports[Transport.PLAINTEXT],
        ports[Transport.TLS],
        {Transport.TLS: "no TLS here", Transport.PLAINTEXT: "TLS only"},
        **kw,
    )
    return front, await front.start("127.0.0.1", 0)


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


async def test_each_connection_goes_where_its_first_byte_says(upstreams):
    plain, tls = upstreams
    front, port = await _front({Transport.PLAINTEXT: plain.port, Transport.TLS: tls.port})
    try:
        assert await _exchange(port, PREFACE) == b"plain:" + PREFACE
        assert await _exchange(port, TLS_HELLO) == b"tls:" + TLS_HELLO
        assert front.counts == {Transport.PLAINTEXT: 1, Transport.TLS: 1}
    finally:
        await front.close()


async def test_the_client_behind_a_relay_is_named_as_grpc_names_peers(upstreams):
    plain, _ = upstreams
    front, port = await _front({Transport.PLAINTEXT: plain.port, Transport.TLS: None})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(PREFACE)
        await asyncio.wait_for(reader.read(65536), 5)
        host, relay_port = plain.peers[0]
        client = grpc_peer(*writer.get_extra_info("sockname")[:2])
        assert front.client_of(grpc_peer(host, relay_port)) == client
        assert front.client_of("ipv4:127.0.0.1:1") == "ipv4:127.0.0.1:1"  # not a relay's
    finally:
        writer.close()
        await front.close()


async def test_a_kind_not_taken_is_closed_with_one_line_that_says_why(upstreams, caplog):
    plain, _ = upstreams
    front, port = await _front({Transport.PLAINTEXT: plain.port, Transport.TLS: None})
    caplog.set_level(logging.WARNING, "proxy.security.front")
    try:
        for _ in range(3):
            assert await _exchange(port, TLS_HELLO) == b""  # closed, nothing relayed
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines  # the others within the second are counted
        assert lines[0].startswith("tls client ipv4:127.0.0.1:") and "no TLS here" in lines[0]
        assert front.refused[Transport.TLS] == 3 and plain.peers == []
        assert await _exchange(port, PREFACE) == b"plain:" + PREFACE  # the other kind goes on
    finally:
        await front.close()


async def test_either_end_closing_closes_the_other(upstreams):
    plain, _ = upstreams
    front, port = await _front({Transport.PLAINTEXT: plain.port, Transport.TLS: None})
    try:
        # The server ends the connection (gRPC after its GOAWAY): the client sees EOF.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE)
        await asyncio.wait_for(reader.read(65536), 5)
        plain.writers[0].close()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await wait_until(lambda: front.status()["open"] == 0, timeout=5)
        # The client goes: the relay's connection to the server goes too.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE)
        await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
        await wait_until(lambda: front.status()["open"] == 0, timeout=5)
        await wait_until(lambda: plain.writers[1].is_closing(), timeout=5)
    finally:
        await front.close()


async def test_a_silent_client_is_closed_and_close_ends_every_relay(upstreams):
    plain, _ = upstreams
    front, port = await _front(
        {Transport.PLAINTEXT: plain.port, Transport.TLS: None},
        first_byte_timeout_s=0.2,
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # said nothing: closed
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE)
        await asyncio.wait_for(reader.read(65536), 5)
    finally:
        await front.close()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert front.status()["open"] == 0


async def test_a_large_transfer_passes_whole_both_ways(upstreams):
    """More than the relay's buffers hold: reading pauses and resumes, nothing is lost."""
    plain, _ = upstreams
    front, port = await _front({Transport.PLAINTEXT: plain.port, Transport.TLS: None})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        payload = PREFACE + bytes(range(256)) * 16_384  # 4 MiB
        writer.write(payload)
        got = bytearray()
        while got.replace(b"plain:", b"") != payload:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert chunk, "closed early"
            got += chunk
    finally:
        writer.close()
        await front.close()
