"""The gRPC port's front: TLS and plaintext clients on one port.

grpcio serves a port either with TLS or without, never both, while the official clients
differ in what they do by default: the Java client turns TLS on, the Python client leaves it
off. The Apache proxy serves both on its one port ("permissive"). So does this one: the
front accepts every client connection, reads its first byte (a TLS connection opens with a
handshake record, 0x16; an HTTP/2 one with the ``PRI`` of its preface) and relays it, bytes
as they come, to the gRPC server's TLS or plaintext port on loopback. Each connection stays
one connection end to end: the gRPC server's GOAWAYs reach the client, and a client that
closes closes the relay.

A connection the TLS mode does not take (a TLS client of a ``disabled`` proxy, a plaintext
client of an ``enforcing`` one) is closed with a line in the log that says why, which
gRPC's own refusal never does.

gRPC sees each call's peer as the relay's loopback address: ``client_of`` turns that back
into the client's, which the drain matches against the kernel's table of the front's
connections (``proxy.api.connections``).

With ``proxy_protocol`` on, a connection may open with a PROXY header (a load balancer's,
``proxy_protocol.py``): the front reads it, relays the rest, and ``address_of`` names the
client the header names. Off, a connection that opens with one is closed with a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from typing import cast

from proxy.api.connections import grpc_peer
from proxy.security import proxy_protocol
from proxy.security.proxy_protocol import Opening, ProxyHeaderError

log = logging.getLogger(__name__)

# The first byte of a TLS connection: the record type of its ClientHello (handshake).
_TLS_HANDSHAKE = 0x16
# A client that says nothing for this long after connecting is closed.
FIRST_BYTE_TIMEOUT_S = 30.0
# Bytes a relay holds for a side that cannot take them yet before it stops reading the
# other side (asyncio's write buffer limits; a client's first bytes while its relay to the
# gRPC server opens).
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
# At most one refusal line per this many seconds; the lines between are counted.
REFUSAL_LOG_EVERY_S = 1.0


class Transport(enum.StrEnum):
    TLS = "tls"
    PLAINTEXT = "plaintext"


class TlsFront:
    """Listens on the client port and relays each connection to ``plaintext_port`` or
    ``tls_port`` of the gRPC server on ``127.0.0.1``; a port of None refuses that kind of
    client, ``refusals`` says why in the log."""

    def __init__(
        self,
        plaintext_port: int | None,
        tls_port: int | None,
        refusals: dict[Transport, str],
        *,
        first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S,
        proxy_protocol: bool = False,
    ) -> None:
        self._ports = {Transport.PLAINTEXT: plaintext_port, Transport.TLS: tls_port}
        self.proxy_protocol = proxy_protocol
        self._refusals = refusals
        self._first_byte_timeout_s = first_byte_timeout_s
        self._server: asyncio.Server | None = None
        self._relays: set[_Relay] = set()
        # The relay's own loopback port (the peer gRPC sees) -> the client as gRPC names one.
        self._clients: dict[int, str] = {}
        # ... -> the client a PROXY header named, as "host:port".
        self._origins: dict[int, str] = {}
        self.counts = dict.fromkeys(Transport, 0)
        self.refused = dict.fromkeys(Transport, 0)
        self.proxy_headers = 0  # connections that opened with a PROXY header read
        self.refused_headers = 0  # ... with one that did not parse, or while it is off
        self._logged_at = 0.0
        self._unlogged = 0

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: a free port); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ClientSide(self),
            host,
            port,
            reuse_port=reuse_port or None,
            backlog=4096,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def client_of(self, peer: str) -> str:
        """The client behind a gRPC peer (``ipv4:127.0.0.1:<relay port>``); a peer no relay
        opened as it is."""
        port = peer.rpartition(":")[2]
        return self._clients.get(int(port), peer) if port.isdigit() else peer

    def address_of(self, peer: str) -> str:
        """The client's address behind a gRPC peer, as the Apache proxy writes a remote
        address: the PROXY header's ``host:port`` if one named it, else the connection's
        (``1.2.3.4:5678``, ``[::1]:5678``)."""
        port = peer.rpartition(":")[2]
        if port.isdigit():
            origin = self._origins.get(int(port))
            if origin is not None:
                return origin
        return peer_address(self.client_of(peer))

    def stop_accepting(self) -> None:
        """New connections are refused by the kernel from now on; open ones go on."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop accepting and close every relay (their gRPC connections have ended)."""
        self.stop_accepting()
        for relay in list(self._relays):
            relay.close()
        if self._server is not None:
            # Closed relays are gone once their transports have called back.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None

    def status(self) -> dict[str, object]:
        return {
            "open": len(self._relays),
            "accepted": {t.value: n for t, n in self.counts.items()},
            "refused": {t.value: n for t, n in self.refused.items()},
            "proxy_protocol": {
                "on": self.proxy_protocol,
                "headers": self.proxy_headers,
                "refused": self.refused_headers,
            },
        }

    # -- called by the relays -------------------------------------------------------------

    def _route(self, relay: _Relay, first: int) -> int | None:
        """The gRPC port for a connection whose first byte is ``first``; None: refuse it."""
        kind = Transport.TLS if first == _TLS_HANDSHAKE else Transport.PLAINTEXT
        port = self._ports[kind]
        if port is None:
            self.refused[kind] += 1
            self._log_refusal(relay.client, kind)
        else:
            self.counts[kind] += 1
        return port

    def _refuse_header(self, relay: _Relay, why: str) -> None:
        self.refused_headers += 1
        self._log(f"client {relay.client} refused: it opened with a PROXY header {why}")

    def _log_refusal(self, client: str, kind: Transport) -> None:
        self._log(f"{kind.value} client {client} refused: {self._refusals[kind]}")

    def _log(self, line: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < REFUSAL_LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since the last line)" if self._unlogged else ""
        log.warning("%s%s", line, more)
        self._logged_at = now
        self._unlogged = 0

    def _opened(self, relay: _Relay, local_port: int) -> None:
        self._clients[local_port] = relay.client
        if relay.origin is not None:
            self._origins[local_port] = relay.origin

    def _closed(self, relay: _Relay) -> None:
        self._relays.discard(relay)
        if relay.local_port is not None:
            self._clients.pop(relay.local_port, None)
            self._origins.pop(relay.local_port, None)


def peer_address(peer: str) -> str:
    """A gRPC peer (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``) as ``host:port``."""
    scheme, _, rest = peer.partition(":")
    return rest if scheme in ("ipv4", "ipv6") and rest else peer


class _Relay:
    """One client connection and its connection to the gRPC server."""

    __slots__ = (
        "client",
        "closed",
        "connecting",
        "downstream",
        "front",
        "head",
        "header_read",
        "local_port",
        "origin",
        "pending",
        "timer",
        "upstream",
    )

    def __init__(self, front: TlsFront, downstream: asyncio.Transport) -> None:
        self.front = front
        self.downstream = downstream
        peer = downstream.get_extra_info("peername")
        self.client = grpc_peer(peer[0], peer[1]) if peer else "unknown"
        self.origin: str | None = None  # the client a PROXY header named, "host:port"
        self.head = b""  # first bytes too few to tell whether they open a PROXY header
        self.header_read = False
        self.upstream: asyncio.Transport | None = None
        self.local_port: int | None = None
        self.pending: list[bytes] = []  # the client's bytes while the upstream opens
        self.connecting: asyncio.Task[None] | None = None
        self.closed = False
        loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = loop.call_later(
            front._first_byte_timeout_s, self.close
        )
        downstream.set_write_buffer_limits(HIGH_WATER, LOW_WATER)

    def first_bytes(self, data: bytes) -> None:
        data, self.head = self.head + data, b""
        # One header at most, before anything else: what follows one is the client's own.
        kind = Opening.OTHER if self.header_read else proxy_protocol.opening(data)
        if kind is Opening.UNDECIDED:
            self.head = data  # a few bytes: the first-byte timer still runs
            return
        if kind is Opening.HEADER:
            if not self.front.proxy_protocol:
                self.front._refuse_header(self, "but security.proxy_protocol is off")
                self.close()
                return
            try:
                header = proxy_protocol.parse(data)
            except ProxyHeaderError as exc:
                self.front._refuse_header(self, f"that does not parse: {exc}")
                self.close()
                return
            if header is None:
                self.head = data
                return
            self.front.proxy_headers += 1
            self.header_read = True
            if header.source is not None:
                host, source_port = header.source
                self.origin = f"{host}:{source_port}"
            data = data[header.length :]
            if not data:
                return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        port = self.front._route(self, data[0])
        if port is None:
            self.close()
            return
        self.pending.append(data)
        self.connecting = asyncio.get_running_loop().create_task(self._connect(port))

    async def _connect(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(lambda: _ServerSide(self), "127.0.0.1", port)
        except OSError as exc:
            log.debug("relay for %s: the gRPC server's port %d: %s", self.client, port, exc)
            self.close()
            return
        finally:
            self.connecting = None
        if self.closed:
            upstream.close()
            return
        self.upstream = upstream
        upstream.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        self.local_port = upstream.get_extra_info("sockname")[1]
        self.front._opened(self, self.local_port)
        upstream.write(b"".join(self.pending))
        self.pending.clear()
        self.downstream.resume_reading()

    def from_client(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.pending.append(data)
        if sum(map(len, self.pending)) > HIGH_WATER:
            self.downstream.pause_reading()  # resumed once the upstream is open

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.connecting is not None:
            self.connecting.cancel()
        self.downstream.close()
        if self.upstream is not None:
            self.upstream.close()
        self.front._closed(self)


class _ClientSide(asyncio.Protocol):
    __slots__ = ("front", "relay")

    def __init__(self, front: TlsFront) -> None:
        self.front = front
        self.relay: _Relay | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.relay = _Relay(self.front, cast(asyncio.Transport, transport))
        self.front._relays.add(self.relay)

    def data_received(self, data: bytes) -> None:
        relay = self.relay
        assert relay is not None
        if relay.upstream is not None:
            relay.upstream.write(data)
        elif relay.connecting is None and not relay.pending:
            relay.first_bytes(data)
        else:
            relay.from_client(data)

    def eof_received(self) -> bool:
        return False  # close: gRPC has nothing to say to a client that stopped sending

    def connection_lost(self, exc: Exception | None) -> None:
        if self.relay is not None:
            self.relay.close()

    def pause_writing(self) -> None:
        if self.relay is not None and self.relay.upstream is not None:
            self.relay.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.relay is not None and self.relay.upstream is not None:
            self.relay.upstream.resume_reading()


class _ServerSide(asyncio.Protocol):
    __slots__ = ("relay",)

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.downstream.write(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()

    def pause_writing(self) -> None:
        self.relay.downstream.pause_reading()

    def resume_writing(self) -> None:
        self.relay.downstream.resume_reading()
