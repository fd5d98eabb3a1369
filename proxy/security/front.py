"""The gRPC port's front: TLS and plaintext clients on one port.

grpcio serves a port either with TLS or without, never both, while the official clients
differ in what they do by default: the Java client turns TLS on, the Python client leaves it
off. The Apache proxy serves both on its one port ("permissive"). So does this one: the
front accepts every client connection, reads its first byte (a TLS connection opens with a
handshake record, 0x16; an HTTP/2 one with the ``PRI`` of its preface) and relays it, bytes
as they come, to the gRPC server's TLS or plaintext port on loopback. Each connection stays
one connection end to end: the gRPC server's GOAWAYs reach the client; a side that stops
sending (a FIN) is passed on and the other may still answer; a side that closes closes the
relay. A relay's connection to the gRPC server that does not open (the loopback ports, the
open-files limit) closes the client at once, logged and counted, never silently. Each
relay takes its three descriptors (``FDS_PER_RELAY``) from the process's open-files budget
(``proxy.descriptors.process_budget``) before it opens and gives them back once both its
sides are gone: every front of the process (the gRPC port's, the remoting port's, one per
broker port) and the brokers' registration slots share that one budget, so a client the
budget has no room for is closed at once, logged and counted (``refused_limit``), before
any descriptor the rest of the process needs (``FD_RESERVE``) runs out. ``max_relays``
caps one front below the budget, if it is given. Each
relay holds at most ``HIGH_WATER`` bytes for a side that is not reading: past it, the other
side is not read until it drains. A relay that is closed while a side still holds unsent
bytes it does not read is aborted after ``CLOSE_FLUSH_S``.

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
from collections.abc import Callable
from typing import cast

from proxy.api.connections import grpc_peer
from proxy.descriptors import DescriptorBudget, process_budget
from proxy.observability.log_every import LogEvery
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
# A closed relay's sides get this long to hand over what they still hold, then are aborted.
CLOSE_FLUSH_S = 5.0
# Descriptors one relay holds: the client's socket and both ends of its loopback
# connection to the gRPC server (this process holds both).
FDS_PER_RELAY = 3


def relay_limit() -> int:
    """The relays the process's open-files budget would give one front that had it all
    (``proxy.descriptors``, ``FD_RESERVE`` kept): a figure to show, not a share to take.
    The fronts take their relays from ``process_budget()`` itself, so what they open
    together never passes it."""
    return max(1, process_budget().total // FDS_PER_RELAY)


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
        count: Callable[[str], None] | None = None,
        max_relays: int | None = None,
        budget: DescriptorBudget | None = None,
    ) -> None:
        """``count(result)``: told of each connection's fate (``ProxyMetrics
        .front_connection``): its kind once relayed, ``refused_<kind>``,
        ``refused_proxy_header``, ``refused_limit`` or ``connect_failed``.
        ``budget``: where each relay takes its descriptors (None: the process's, shared
        with every other front and the registrations); ``max_relays``: relays open (or
        closing) on this front at most, below the budget (None: as many as it gives)."""
        self.budget = process_budget() if budget is None else budget
        self.max_relays = max_relays
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
        # Relays whose connection to the gRPC server did not open (the client was closed).
        self.connect_failures = 0
        self.refused_limit = 0  # clients closed at once: max_relays were open
        # Relays closed whose transports have not both gone yet (CLOSE_FLUSH_S).
        self._closing: set[_Relay] = set()
        self._count = count or (lambda result: None)
        self._refusals_log = LogEvery(log, REFUSAL_LOG_EVERY_S)

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

    def relays(self, peer: str) -> bool:
        """Whether ``peer`` is one of this front's relays (several fronts serve one server
        when a proxy has several public ports)."""
        port = peer.rpartition(":")[2]
        return port.isdigit() and int(port) in self._clients

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
        """Stop accepting and close every relay (their gRPC connections have ended); a side
        that still holds bytes its peer does not read is aborted."""
        self.stop_accepting()
        for relay in list(self._relays):
            relay.close()
        for relay in list(self._closing):
            relay.abort()
        if self._server is not None:
            # Closed relays are gone once their transports have called back.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None

    def status(self) -> dict[str, object]:
        """``open``: relays serving a client; ``accepted``: connections relayed to the gRPC
        server (counted once their relay opened); ``connect_failed``: ones whose relay did
        not open; ``refused_limit``: ones closed at once, the budget (or ``max_relays``)
        having no room; ``max_relays``: the most this front may open (its own cap, else
        the whole budget's worth); ``budget``: the process's descriptors, held by every
        front and the registrations together."""
        cap = self.budget.total // FDS_PER_RELAY
        return {
            "open": len(self._relays),
            "accepted": {t.value: n for t, n in self.counts.items()},
            "connect_failed": self.connect_failures,
            "max_relays": cap if self.max_relays is None else min(cap, self.max_relays),
            "refused_limit": self.refused_limit,
            "budget": self.budget.status(),
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
        relay.kind = kind
        port = self._ports[kind]
        if port is None:
            self.refused[kind] += 1
            self._count(f"refused_{kind.value}")
            self._log_refusal(relay.client, kind)
        return port

    def _connected(self, relay: _Relay) -> None:
        assert relay.kind is not None
        self.counts[relay.kind] += 1
        self._count(relay.kind.value)

    def _connect_failed(self, relay: _Relay, port: int, exc: OSError) -> None:
        self.connect_failures += 1
        self._count("connect_failed")
        self._log(
            f"client {relay.client} closed: its relay to the gRPC server's port {port} did not "
            f"open ({exc}); raise the open-files limit (ulimit -n) if it says too many files"
        )

    def _admit(self, transport: asyncio.BaseTransport) -> bool:
        """Whether a new client gets a relay: its descriptors fit in the budget (and this
        front is below ``max_relays``); else it is reset at once."""
        here = len(self._relays) + len(self._closing)
        if (self.max_relays is None or here < self.max_relays) and self.budget.take(FDS_PER_RELAY):
            return True
        self.refused_limit += 1
        self._count("refused_limit")
        peer = transport.get_extra_info("peername")
        client = grpc_peer(peer[0], peer[1]) if peer else "unknown"
        self._log(
            f"client {client} refused: {here} relays are open, as many as the open-files "
            f"limit leaves room for beside the process's other connections "
            f"({self.budget.held} of the {self.budget.total} descriptors it leaves held); "
            f"raise it (ulimit -n)"
        )
        cast(asyncio.Transport, transport).abort()
        return False

    def _refuse_header(self, relay: _Relay, why: str) -> None:
        self.refused_headers += 1
        self._count("refused_proxy_header")
        self._log(f"client {relay.client} refused: it opened with a PROXY header {why}")

    def _log_refusal(self, client: str, kind: Transport) -> None:
        self._log(f"{kind.value} client {client} refused: {self._refusals[kind]}")

    def _log(self, line: str) -> None:
        self._refusals_log.warning("%s", line)

    def _opened(self, relay: _Relay, local_port: int) -> None:
        self._clients[local_port] = relay.client
        if relay.origin is not None:
            self._origins[local_port] = relay.origin

    def _closed(self, relay: _Relay) -> None:
        self._relays.discard(relay)
        self._closing.add(relay)
        if relay.local_port is not None:
            self._clients.pop(relay.local_port, None)
            self._origins.pop(relay.local_port, None)

    def _gone(self, relay: _Relay) -> None:
        self._closing.discard(relay)
        if relay.budgeted:  # once, however many of its sides call back
            relay.budgeted = False
            self.budget.give(FDS_PER_RELAY)


def peer_address(peer: str) -> str:
    """A gRPC peer (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``) as ``host:port``."""
    scheme, _, rest = peer.partition(":")
    return rest if scheme in ("ipv4", "ipv6") and rest else peer


class _Relay:
    """One client connection and its connection to the gRPC server."""

    __slots__ = (
        "budgeted",
        "client",
        "client_done",
        "client_gone",
        "closed",
        "connecting",
        "downstream",
        "front",
        "head",
        "header_read",
        "kind",
        "local_port",
        "origin",
        "pending",
        "server_done",
        "server_gone",
        "timer",
        "upstream",
        "upstream_full",
        "waiting_upstream",
    )

    def __init__(self, front: TlsFront, downstream: asyncio.Transport) -> None:
        self.front = front
        self.downstream = downstream
        # Whether it holds FDS_PER_RELAY of the front's budget (admitted, not yet gone).
        self.budgeted = False
        peer = downstream.get_extra_info("peername")
        self.client = grpc_peer(peer[0], peer[1]) if peer else "unknown"
        self.origin: str | None = None  # the client a PROXY header named, "host:port"
        self.head = b""  # first bytes too few to tell whether they open a PROXY header
        self.header_read = False
        self.kind: Transport | None = None
        # Why the client is not read: its bytes wait for the upstream to open, or the
        # upstream holds HIGH_WATER unsent. Reading resumes only when neither holds.
        self.waiting_upstream = False
        self.upstream_full = False
        # Sides that have stopped sending (EOF), and have gone (connection lost).
        self.client_done = self.server_done = False
        self.client_gone = self.server_gone = False
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
            self.front._connect_failed(self, port, exc)
            self.close()
            return
        finally:
            self.connecting = None
        if self.closed:
            upstream.close()
            return
        self.upstream_opened(upstream)

    def upstream_opened(self, upstream: asyncio.Transport) -> None:
        """The relay's connection to the gRPC server is open: send what the client sent
        meanwhile, then read the client again unless that filled the upstream."""
        self.upstream = upstream
        upstream.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        self.local_port = upstream.get_extra_info("sockname")[1]
        self.front._opened(self, self.local_port)
        self.front._connected(self)
        upstream.write(b"".join(self.pending))  # may fill it: pause_writing says so
        self.pending.clear()
        if self.client_done and upstream.can_write_eof():
            upstream.write_eof()
        self.waiting_upstream = False
        self.read_client_if_free()

    def from_client(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.pending.append(data)
        if sum(map(len, self.pending)) > HIGH_WATER:
            self.waiting_upstream = True
            self.downstream.pause_reading()

    def read_client_if_free(self) -> None:
        """Read the client again, unless something still holds it (either reason)."""
        if not (self.waiting_upstream or self.upstream_full or self.closed):
            self.downstream.resume_reading()

    def eof_from(self, client: bool) -> bool:
        """One side stopped sending: tell the other (it may still answer), and keep the
        relay open until both have; True keeps the transport that saw the EOF open."""
        if client:
            self.client_done = True
            to = self.upstream
        else:
            self.server_done = True
            to = self.downstream
        if self.client_done and self.server_done:
            self.close()
            return False
        if to is None:
            if self.connecting is not None:
                return True  # the relay opens, sends what the client sent, then its EOF
            self.close()  # a client that said nothing routable and stopped
            return False
        if to.can_write_eof():
            to.write_eof()
        return True

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
        # A side still flushing to a peer that does not read would stay open for good.
        self.timer = asyncio.get_running_loop().call_later(CLOSE_FLUSH_S, self.abort)

    def abort(self) -> None:
        """Drop both sides now, whatever they still hold (a bounded close)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.downstream.abort()
        if self.upstream is not None:
            self.upstream.abort()
        self.front._gone(self)

    def gone(self, client: bool) -> None:
        """One side's connection is gone: the relay is closed, and done with once both are
        (or the client's, when no upstream opened)."""
        if client:
            self.client_gone = True
        else:
            self.server_gone = True
        self.close()
        if self.client_gone and (self.server_gone or self.upstream is None):
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.front._gone(self)


class _ClientSide(asyncio.Protocol):
    __slots__ = ("front", "relay")

    def __init__(self, front: TlsFront) -> None:
        self.front = front
        self.relay: _Relay | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.front._admit(transport):
            return
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.relay = _Relay(self.front, cast(asyncio.Transport, transport))
        self.relay.budgeted = True  # _admit took its descriptors
        self.front._relays.add(self.relay)

    def data_received(self, data: bytes) -> None:
        relay = self.relay
        if relay is None:  # refused at the relay limit
            return
        if relay.upstream is not None:
            relay.upstream.write(data)
        elif relay.connecting is None and not relay.pending:
            relay.first_bytes(data)
        else:
            relay.from_client(data)

    def eof_received(self) -> bool:
        return self.relay is None or self.relay.eof_from(client=True)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.relay is not None:
            self.relay.gone(client=True)

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
        return self.relay.eof_from(client=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.gone(client=False)

    def pause_writing(self) -> None:
        self.relay.upstream_full = True
        self.relay.downstream.pause_reading()

    def resume_writing(self) -> None:
        self.relay.upstream_full = False
        self.relay.read_client_if_free()
