"""The client connections a drain waits for.

grpcio tells an application nothing about connections, only about calls, and each call
names its peer (``context.peer()``: the client's, or its balancer's, address and port), one
per TCP connection. Every connection gets an HTTP/2 GOAWAY at its maximum age
(``grpc_max_connection_age_s``, stretched by up to ``CONNECTION_AGE_JITTER``), after which
its client opens a new one for its next call: behind a balancer that follows /readyz, to
another proxy once this one drains. So a draining proxy may stop its server, whose own
GOAWAY cancels the calls that cross it, once every connection that still carries calls
has aged (``Drain._let_clients_move``).

Which connections are still open, the kernel knows: on Linux the drain reads this
process's established TCP connections to its gRPC port (``open_peers``: /proc/net/tcp and
tcp6, kept to this process's own sockets). A connection counts as *busy* while it is open
and has not aged, whether it carries a call now or not: a client whose Telemetry stream has
ended (the Python client reopens it only at its next settings sync, minutes later) and that
sends once a second is quiet most of the time, but its next call would cross the server's
stop. A connection the kernel lists and no call has named yet (its first call still waits
in gRPC's queue) opened no later than the drain first saw it. A client that closed its
channel is gone from the table at once: a test's proxy, or a fleet's, does not wait out the
age of connections whose clients are gone.

Where the table cannot be read, a connection counts as busy while it holds a call or has
finished one within ``IDLE_S``, a guess that misses a quiet client.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from proxy.api.context import Context

# gRPC stretches each connection's maximum age by up to this share, so that a fleet's
# connections do not all end at once.
CONNECTION_AGE_JITTER = 0.1
# After the age GOAWAY is due: time for it to reach the client and for the client's calls
# already on the wire to arrive.
AGED_MARGIN_S = 0.5
# Without the kernel's table: a connection with no call open and none for this long is
# taken to be idle (its client has closed it, or sends so rarely that a call crossing the
# server's stop is unlikely).
IDLE_S = 0.5
# Forget aged connections that hold no call at most this often (their GOAWAY has gone: no
# new call comes on them, and gRPC closes them once their last call ends).
PRUNE_EVERY_S = 1.0
# TCP states in /proc/net/tcp's "st" column: ESTABLISHED, and the states of a connection
# one side has begun to close (FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK, CLOSING).
_ESTABLISHED = frozenset({"01"})
_CLOSING = frozenset({"04", "05", "08", "09", "0B"})
# What a call is wrapped in when connections never age: nothing to note.
_UNTRACKED: AbstractContextManager[None] = contextlib.nullcontext()


def _same_peer(peer: str) -> str:
    return peer


@dataclass(slots=True)
class _Connection:
    first_at: float  # its first call: it opened no later, so it ages no later than this + age
    last_at: float  # its last call started or ended
    open: int = 0  # calls open on it


class Connections:
    """The connections calls came on, from their first call until they have aged."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        # How long a connection can live from its first call; 0: connections never age, and
        # there is nothing to wait for.
        self.lifetime_s = 0.0
        if max_age_s > 0:
            self.lifetime_s = max_age_s * (1 + CONNECTION_AGE_JITTER) + AGED_MARGIN_S
        self._clock = clock
        self._by_peer: dict[str, _Connection] = {}
        self._pruned_at = 0.0
        # The open connections the kernel listed, from when the drain first saw them: one
        # no call has named yet opened no later than that.
        self._listed: dict[str, float] = {}
        # The client behind the peer gRPC names: the TLS front relays every connection, so
        # gRPC sees the relay's loopback address (``TlsFront.client_of``).
        self.client_of: Callable[[str], str] = _same_peer

    def call(self, context: Context) -> AbstractContextManager[None]:
        """One call, on the connection its ``context`` names, for as long as it is open.
        With connections that never age, nothing: no peer is asked for (every call pays
        this, so it costs nothing when unused)."""
        return self.on(self.client_of(context.peer())) if self.lifetime_s else _UNTRACKED

    @contextlib.contextmanager
    def on(self, peer: str) -> Iterator[None]:
        """One call on the connection ``peer`` names, for as long as it is open."""
        now = self._clock()
        conn = self._by_peer.get(peer)
        if conn is None or now - conn.first_at >= self.lifetime_s:
            # New, or a new connection from a port an aged one used (an aged connection
            # takes no new call).
            conn = self._by_peer[peer] = _Connection(now, now)
        conn.open += 1
        conn.last_at = now
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._prune(now)
        try:
            yield
        finally:
            conn.open -= 1
            conn.last_at = self._clock()

    def busy(self, open_peers: Collection[str] | None = None) -> int:
        """Connections a call may still come on after the server's stop: those open
        (``open_peers``, the kernel's table) that have not aged; or, without the table,
        those not aged that hold a call or had one within ``IDLE_S``."""
        now = self._clock()
        if open_peers is None:
            return sum(
                1
                for c in self._by_peer.values()
                if now - c.first_at < self.lifetime_s and (c.open or now - c.last_at < IDLE_S)
            )
        self._note_listed(open_peers, now)
        return sum(1 for p in open_peers if now - self._opened_by(p) < self.lifetime_s)

    def describe(self, open_peers: Collection[str], busy_only: bool = False) -> list[str]:
        """Open connections as a drain's log line names them: each peer, how long since it
        opened at the latest, the calls open on it. ``busy_only``: those not aged yet."""
        now = self._clock()
        self._note_listed(open_peers, now)
        described = []
        for peer in sorted(open_peers):
            age = now - self._opened_by(peer)
            if busy_only and age >= self.lifetime_s:
                continue
            conn = self._by_peer.get(peer)
            calls = "no call seen" if conn is None else f"{conn.open} calls open"
            described.append(f"{peer} (opened {age:.1f} s ago or more, {calls})")
        return described

    def _note_listed(self, open_peers: Collection[str], now: float) -> None:
        """Keep when each open connection was first listed; forget those gone."""
        self._listed = {p: self._listed.get(p, now) for p in open_peers}

    def _opened_by(self, peer: str) -> float:
        conn = self._by_peer.get(peer)
        listed = self._listed[peer]
        return listed if conn is None else min(conn.first_at, listed)

    def __len__(self) -> int:
        return len(self._by_peer)

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        aged = [
            p
            for p, c in self._by_peer.items()
            if not c.open and now - c.first_at >= self.lifetime_s
        ]
        # An aged connection still holding a call (a Telemetry stream) stays known, so that
        # the kernel's table does not show it to the drain as a connection never named.
        for peer in aged:
            del self._by_peer[peer]


def open_peers(port: int, closing: bool = False) -> frozenset[str] | None:
    """This process's established TCP connections to its local ``port``, each named as gRPC
    names a call's peer (``ipv4:10.0.0.1:5000``, ``ipv6:[::1]:5000``); ``None`` where the
    kernel's table cannot be read (not Linux). ``closing``: also those being closed, which
    carry no new call but can still hold gRPC's stop. Reads files: call it off the event
    loop."""
    states = _ESTABLISHED | _CLOSING if closing else _ESTABLISHED
    try:
        mine = _socket_inodes()
        peers: set[str] = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            if table.endswith("6") and not os.path.exists(table):
                continue  # a kernel without IPv6
            with open(table, encoding="ascii") as rows:
                peers.update(_peers_in(rows, port, mine, states))
    except OSError:
        return None
    return frozenset(peers)


def _socket_inodes() -> set[str]:
    """The inodes of this process's sockets: /proc/net lists the whole network namespace,
    other processes' connections to the same port (a proxy's other workers) among them."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    return inodes


def _peers_in(
    rows: Iterator[str], port: int, inodes: set[str], states: frozenset[str]
) -> Iterator[str]:
    """The remote ends of the connections to ``port`` in one /proc/net/tcp* table whose
    socket is one of ``inodes`` and whose state is one of ``states``."""
    local_port = f":{port:04X}"
    next(rows, None)  # the header
    for row in rows:
        # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
        fields = row.split()
        if (
            len(fields) > 9
            and fields[3] in states
            and fields[1].endswith(local_port)
            and fields[9] in inodes
        ):
            yield _peer_name(fields[2])


def _peer_name(address: str) -> str:
    """``0100007F:1388`` (the address as 32-bit words printed in the machine's byte order,
    then the port) as gRPC writes a peer. gRPC writes an IPv4 client of an IPv6 listener as
    IPv4."""
    hex_ip, hex_port = address.split(":")
    raw = b"".join(
        int(hex_ip[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_ip), 8)
    )
    return grpc_peer(ipaddress.ip_address(raw), int(hex_port, 16))


def grpc_peer(host: str | ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """An address as gRPC writes a call's peer: ``ipv4:10.0.0.1:5000``, ``ipv6:[::1]:5000``;
    an IPv4 client of an IPv6 listener as IPv4."""
    ip = ipaddress.ip_address(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return f"ipv6:[{ip}]:{port}"
    v4 = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else ip
    return f"ipv4:{v4}:{port}"
