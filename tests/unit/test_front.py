"""The TLS front (proxy/security/front.py) over real loopback sockets: each connection goes
to the port its first byte names, bytes pass both ways unchanged, a kind the mode does not
take is closed with a line that says why, and either end closing closes the other."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

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
    """More than the relay's buffers hold, both ways at once: nothing is lost (the pausing
    itself: ``test_a_side_that_does_not_read_stops_the_relay_reading_the_other``)."""
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


# -- failures, backpressure, half-close, a bounded close --------------------------------------


async def test_a_relay_that_cannot_open_closes_its_client_logged_and_counted(caplog):
    """The gRPC server's port refuses (as when the open-files limit or the loopback ports
    run out): the client is closed at once, the line says why, and it is not counted as
    accepted."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    results: list[str] = []
    front, port = await _front(
        {Transport.PLAINTEXT: dead_port, Transport.TLS: None}, count=results.append
    )
    caplog.set_level(logging.WARNING, logger="proxy.security.front")
    try:
        assert await _exchange(port, PREFACE) == b""
        await wait_until(lambda: front.status()["open"] == 0, timeout=5)
        status = front.status()
        assert status["connect_failed"] == 1 and status["accepted"] == {"tls": 0, "plaintext": 0}
        assert results == ["connect_failed"]
        assert f"its relay to the gRPC server's port {dead_port} did not open" in caplog.text
    finally:
        await front.close()


class Silent:
    """An upstream that accepts and never reads, until told to."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.release.wait()
        writer.close()

    async def close(self) -> None:
        self.release.set()
        assert self.server is not None
        self.server.close()


async def test_a_side_that_does_not_read_stops_the_relay_reading_the_other():
    """The gRPC server stops reading: the front stops reading the client once it holds
    HIGH_WATER for the server, rather than buffering what the client sends."""
    from proxy.security.front import HIGH_WATER

    silent = Silent()
    await silent.start()
    front, port = await _front({Transport.PLAINTEXT: silent.port, Transport.TLS: None})
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE)
    sending = asyncio.ensure_future(_send_forever(writer))
    try:
        await wait_until(lambda: bool(front._relays), timeout=5)
        relay = next(iter(front._relays))
        await wait_until(lambda: relay.upstream is not None, timeout=5)
        await wait_until(lambda: not relay.downstream.is_reading(), timeout=10)
        assert relay.upstream is not None
        assert relay.upstream.get_write_buffer_size() <= HIGH_WATER + (1 << 20)
    finally:
        sending.cancel()
        writer.close()
        await front.close()
        await silent.close()


async def _send_forever(writer: asyncio.StreamWriter) -> None:
    chunk = bytes(1 << 20)
    while True:
        writer.write(chunk)
        await writer.drain()


class FakeTransport:
    """Records what the relay asks of a transport; ``on_write`` may call back into it."""

    def __init__(self, on_write=None) -> None:
        self.reading = True
        self.written = 0
        self.on_write = on_write

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.on_write is not None:
            self.on_write()

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 5000) if name in ("peername", "sockname") else None

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def test_an_upstream_filled_by_the_clients_first_bytes_keeps_the_client_paused():
    """The client sent more than HIGH_WATER while the relay opened, and handing it over
    fills the upstream: the client stays unread until the upstream drains."""
    from proxy.security.front import HIGH_WATER, _Relay, _ServerSide

    front = TlsFront(1, None, {})
    client = FakeTransport()
    relay = _Relay(front, client)  # type: ignore[arg-type]
    relay.first_bytes(PREFACE)
    assert relay.connecting is not None
    relay.connecting.cancel()
    relay.connecting = None
    relay.from_client(bytes(HIGH_WATER + 1))
    assert not client.reading  # too much waiting for the upstream
    server_side = _ServerSide(relay)
    upstream = FakeTransport(on_write=server_side.pause_writing)  # the write fills it
    relay.upstream_opened(upstream)  # type: ignore[arg-type]
    assert upstream.written == len(PREFACE) + HIGH_WATER + 1
    assert not client.reading  # still held: the upstream is full
    server_side.resume_writing()
    assert client.reading
    relay.close()


async def test_a_client_that_stops_sending_still_gets_the_answer():
    """A client's FIN is passed on, not taken as the end of both directions: the server
    answers what it read, after the client stopped sending."""

    async def answer_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        data = await reader.read()  # until the client's EOF
        writer.write(b"got " + str(len(data)).encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_after_eof, "127.0.0.1", 0)
    upstream_port = server.sockets[0].getsockname()[1]
    front, port = await _front({Transport.PLAINTEXT: upstream_port, Transport.TLS: None})
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + b"x" * 1000)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == f"got {len(PREFACE) + 1000}".encode()
        writer.close()
        await wait_until(lambda: front.status()["open"] == 0 and not front._closing, timeout=5)
    finally:
        await front.close()
        server.close()


async def test_a_relay_closed_with_bytes_for_a_client_that_does_not_read_is_aborted(
    monkeypatch,
):
    """The server floods a client that never reads; the relay is closed (as when its
    other side goes) with bytes it cannot flush: its sockets are aborted after
    CLOSE_FLUSH_S rather than held open for good."""
    from proxy.security import front as front_module
    from proxy.security.front import HIGH_WATER

    monkeypatch.setattr(front_module, "CLOSE_FLUSH_S", 0.3)

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await reader.read(len(PREFACE))
        writer.write(bytes(32 << 20))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    upstream_port = server.sockets[0].getsockname()[1]
    front, port = await _front({Transport.PLAINTEXT: upstream_port, Transport.TLS: None})
    try:
        # A small receive window: what the relay sends the client stays in the relay.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        _reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(PREFACE)  # and never read
        await wait_until(lambda: bool(front._relays), timeout=5)
        relay = next(iter(front._relays))
        # The client's socket is full, and the relay holds HIGH_WATER more for it.
        await wait_until(lambda: relay.downstream.get_write_buffer_size() >= HIGH_WATER, timeout=10)
        relay.close()
        assert relay in front._closing and front.status()["open"] == 0
        # Aborted: both sides' connections are lost (reported a loop turn after it).
        await wait_until(
            lambda: not front._closing and relay.client_gone and relay.server_gone, timeout=5
        )
        writer.close()
    finally:
        await front.close()
        server.close()


def test_the_process_raises_its_open_files_limit_to_the_hard_one():
    """Each client costs the front three descriptors: at start the soft limit goes up to
    the hard one, and the log says what it got (a process of its own: limits are the
    process's)."""
    import subprocess
    import sys

    script = (
        "import logging, resource, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "from proxy.loop import raise_open_files_limit\n"
        "got = raise_open_files_limit()\n"
        "print('now', resource.getrlimit(resource.RLIMIT_NOFILE)[0], 'hard', hard, 'got', got)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    now, hard = out.split("now ")[1].split()[0], out.split("hard ")[-1].split()[0]
    assert now == hard and f"got {hard}" in out, out
    assert f"open files: soft limit raised from 64 to the hard limit {hard}" in out, out


async def test_fronts_share_one_budget_and_give_back_what_their_relays_held(upstreams):
    """Two fronts of one process (the gRPC port's, a remoting port's) take their relays'
    descriptors from one budget: what one holds the other cannot open, and a relay gone
    gives its three back."""
    from proxy.descriptors import DescriptorBudget
    from proxy.security.front import FDS_PER_RELAY

    plain, _ = upstreams
    budget = DescriptorBudget(2 * FDS_PER_RELAY)
    ports = {Transport.PLAINTEXT: plain.port, Transport.TLS: None}
    first, first_port = await _front(ports, budget=budget)
    second, second_port = await _front(ports, budget=budget)
    held: list[asyncio.StreamWriter] = []
    try:
        for port in (first_port, first_port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            held.append(writer)
            writer.write(PREFACE)
            assert await asyncio.wait_for(reader.read(65536), 5) == b"plain:" + PREFACE
        assert budget.held == 2 * FDS_PER_RELAY
        assert await _exchange(second_port, PREFACE) == b""  # no room left in the process
        assert second.refused_limit == 1 and second.status()["budget"] == budget.status()
        held.pop().close()  # a relay of the first front goes: its descriptors come back
        await wait_until(lambda: budget.held == FDS_PER_RELAY, timeout=10)
        assert await _exchange(second_port, PREFACE) == b"plain:" + PREFACE
    finally:
        for writer in held:
            writer.close()
        await first.close()
        await second.close()
    assert budget.held == 0
