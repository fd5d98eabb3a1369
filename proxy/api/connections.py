"""The client connections a drain waits for.

grpcio tells an application nothing about connections, only about calls, and each call
names its peer (``context.peer()``: the client's, or its balancer's, address and port), one
per TCP connection. Every connection gets an HTTP/2 GOAWAY at its maximum age
(``grpc_max_connection_age_s``, stretched by up to ``CONNECTION_AGE_JITTER``), after which
its client opens a new one for its next call: behind a balancer that follows /readyz, to
another proxy once this one drains. So a draining proxy may stop its server, whose own
GOAWAY cancels the calls that cross it, once every connection that still carries calls
has aged (``ProxyApp._let_clients_move``).

A connection counts as *busy* while it holds a call (every official client keeps a
Telemetry stream open on its connection for its whole life) or has finished one within
``IDLE_S``. A client that closed its channel ends its streams, so its connection stops
counting within ``IDLE_S``: a test's proxy, or a fleet's, does not wait out the age of
connections whose clients are gone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from proxy.api.context import Context

# gRPC stretches each connection's maximum age by up to this share, so that a fleet's
# connections do not all end at once.
CONNECTION_AGE_JITTER = 0.1
# After the age GOAWAY is due: time for it to reach the client and for the client's calls
# already on the wire to arrive.
AGED_MARGIN_S = 0.5
# A connection with no call open and none for this long is idle: its client has closed it,
# or sends so rarely that a call crossing the server's stop is unlikely.
IDLE_S = 0.5
# Forget aged connections at most this often (their GOAWAY has gone: no new call on them).
PRUNE_EVERY_S = 1.0
# What a call is wrapped in when connections never age: nothing to note.
_UNTRACKED: AbstractContextManager[None] = contextlib.nullcontext()


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

    def call(self, context: Context) -> AbstractContextManager[None]:
        """One call, on the connection its ``context`` names, for as long as it is open.
        With connections that never age, nothing: no peer is asked for (every call pays
        this, so it costs nothing when unused)."""
        return self.on(context.peer()) if self.lifetime_s else _UNTRACKED

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

    def busy(self) -> int:
        """Connections not aged yet that hold a call or had one within ``IDLE_S``: a call
        on them may still come after the server's stop."""
        now = self._clock()
        return sum(
            1
            for c in self._by_peer.values()
            if now - c.first_at < self.lifetime_s and (c.open or now - c.last_at < IDLE_S)
        )

    def __len__(self) -> int:
        return len(self._by_peer)

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        aged = [p for p, c in self._by_peer.items() if now - c.first_at >= self.lifetime_s]
        for peer in aged:
            del self._by_peer[peer]  # a call still open on it holds its own reference
