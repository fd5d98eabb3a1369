"""The drain: how a stopping proxy lets its clients go without an error.

First the clients move away while the server still serves (``Drain._let_clients_move``):
each connection's age GOAWAY sends its client's next call to a new connection, which a
balancer following /readyz opens to another proxy. Then the calls in flight end: every poll
answers now, every Telemetry stream gets its end (``Drain._end_calls``), and the server's
stop closes the port and tells every connection still open to go away. docs/reliability.md,
"Drain", says what each step buys and what it measured.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc

from proxy.api.connections import open_peers
from proxy.api.receive import ReceiveActivity
from proxy.api.service import MessagingService
from proxy.api.session import SessionActivity
from proxy.receive.engine import ReceiveEngine
from proxy.security.front import TlsFront

log = logging.getLogger(__name__)

# How long the gRPC server's GOAWAY gets to reach the clients before the drain answers the
# calls in flight on their old connections.
GOAWAY_HEAD_START_S = 0.2
# How often a drain looks whether its clients' connections have aged or closed (it reads
# the kernel's table of connections each time).
MOVE_CHECK_S = 0.25


@dataclass
class Drain:
    """One drain of one proxy's gRPC server: ``run`` once, when the proxy stops."""

    proxy_id: str
    server: grpc.aio.Server
    port: int  # the client port, whose open connections the kernel lists
    front: TlsFront | None
    service: MessagingService
    receive: ReceiveActivity
    engine: ReceiveEngine
    session: SessionActivity
    grace_s: float  # how long calls in flight get once the server stops

    async def _let_clients_move(self) -> bool:
        """The drain's first part: serve on, not ready, until the clients have left. Each
        connection's age GOAWAY (``grpc_max_connection_age_s``) sends its client's next call
        down a new connection, which the balancer, following /readyz, opens to another
        proxy. Unlike the server stop's GOAWAY it leaves the server serving, so a call that
        crosses it is served, not cancelled. Ends once every connection still open has aged
        (``Connections.busy``: at most one connection lifetime). Whether it has: with
        connections that never age, or one still young at the bound, it has not."""
        connections = self.service.connections
        if not connections.lifetime_s:
            return False
        started = time.monotonic()
        deadline = started + connections.lifetime_s
        while True:  # polled: grpcio says nothing when a connection goes
            peers = await asyncio.to_thread(open_peers, self.port)
            busy = connections.busy(peers)
            if not busy or time.monotonic() >= deadline:
                break
            await asyncio.sleep(MOVE_CHECK_S)
        took = time.monotonic() - started
        if not busy:
            log.info("proxy %s draining: clients gone after %.1f s", self.proxy_id, took)
            return True
        # Clients that dial this proxy's own address come back to it after their GOAWAY.
        log.warning("proxy %s draining: %d connections still busy after %.1f s: %s",
                    self.proxy_id, busy, took,
                    ", ".join(connections.describe(peers or (), busy_only=True)))  # fmt: skip
        return False

    def _end_calls(self) -> None:
        """Answer every poll in flight now (empty), and any that still arrives; hand back
        what the polls popped and did not deliver; end every Telemetry stream, with a
        ReconnectEndpointsCommand where the client takes it well (``DrainEnd``)."""
        self.receive.accepting = False
        self.engine.stop_polls()
        streams = self.session.drain()
        log.info("proxy %s draining: %d telemetry streams ended", self.proxy_id,
                 streams)  # fmt: skip

    async def run(self) -> None:
        """The drain. First the clients move away while the server still serves
        (``Drain._let_clients_move``). Then the calls in flight end: every poll answers now,
        every Telemetry stream gets its end (``Drain._end_calls``), and the server's stop closes
        the listener and tells every connection still open to go away (HTTP/2 GOAWAY);
        sends and acks in flight finish within the grace.

        Which of the two comes first depends on whether the clients have moved. If every
        connection still open has had its age GOAWAY, a client whose poll or stream ends
        now polls again, or reopens its stream, on a new connection, at another proxy,
        while this server still serves whatever crosses: the calls end first, and the
        server's stop then finds nothing to wait for. Otherwise (connections that never
        age, or one still young) the server's GOAWAY goes first, else a client would poll
        again, or reopen its stream, on the connection being drained, where gRPC's core
        holds the new call, which no handler takes any more, until the grace ends."""
        moved = await self._let_clients_move()
        grace = self.grace_s
        if moved:
            self._end_calls()
        if self.front is not None:
            self.front.stop_accepting()  # as the server's own listener closes
        stopping = asyncio.ensure_future(self.server.stop(grace=grace))
        try:
            if not moved:
                await asyncio.wait({stopping}, timeout=GOAWAY_HEAD_START_S)
                self._end_calls()
            _, late = await asyncio.wait({stopping}, timeout=max(grace - 0.2, 0.0))
            if late:
                await self._name_what_holds_the_stop(grace)
        finally:
            await stopping
            if self.front is not None:
                await self.front.close()  # its relays' gRPC connections have ended

    async def _name_what_holds_the_stop(self, grace: float) -> None:
        """Just before the grace ends, name what gRPC is about to cancel: each call is an
        error a client sees (CANCELLED), and the connections still open say who held the
        stop (gRPC's stop also waits for every connection to close)."""
        open_calls = +self.service.open_calls
        peers = await asyncio.to_thread(open_peers, self.port, True)
        held = self.service.connections.describe(peers or ())
        log.error("proxy %s: the drain's %.1f s grace ran out; cancelling %s; %d connections "
                  "open: %s", self.proxy_id, grace, dict(open_calls) or "no call of ours",
                  len(held), ", ".join(held))  # fmt: skip
