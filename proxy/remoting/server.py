"""An asyncio remoting server.

A *processor* answers each request. It may return the response at once (the fast path: no
task is created), or an awaitable that resolves to it later (a parked long poll), or None
for no answer. Whatever is still pending when its connection closes is cancelled, so a
parked request of a departed client leaves nothing behind.

The server may also send requests of its own to a connected client (``request``): a
broker's transaction check relayed to the producer that can answer it. Their responses are
matched by ``opaque`` and fail at once when the connection closes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from ssl import SSLContext
from typing import Any, Union

from proxy.descriptors import DescriptorBudget
from proxy.observability.log_every import LogEvery
from proxy.remoting.codes import DEFAULT_MAX_FRAME, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection

log = logging.getLogger(__name__)

Reply = Union[RemotingCommand, Awaitable[RemotingCommand | None], None]  # noqa: UP007
Processor = Callable[[RemotingCommand, RemotingConnection], Reply]

_opaques = itertools.count(1)

# How long ``stop`` lets its connections write out what they hold before it aborts them.
CLOSE_TIMEOUT_S = 5.0
# A request the processor fails on is logged once per this interval at most: a client that
# sends the same bad body again and again (before any authentication) must not fill the log.
FAILURE_LOG_EVERY_S = 60.0


class ConnectionClosedError(Exception):
    """A request of the server's own met a closed connection (or its closing)."""


class RemotingServer:
    """Serves one processor on one TCP port."""

    def __init__(
        self,
        processor: Processor,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_closed: Callable[[RemotingConnection], None] | None = None,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        """``on_closed`` is told of each connection that closes, after its pending
        requests were cancelled. ``close_timeout_s``: how long ``stop`` waits for each
        connection to write out what it holds before it aborts it."""
        self._processor = processor
        self._close_timeout_s = close_timeout_s
        self._failures = LogEvery(log, FAILURE_LOG_EVERY_S)
        self._on_closed = on_closed
        self._max_frame = max_frame
        self._servers: list[asyncio.Server] = []  # one per listening socket
        self._pending: dict[RemotingConnection, set[asyncio.Future[RemotingCommand | None]]] = {}
        # Every open connection: stop closes them all, as a process that exits does (the
        # asyncio server's close leaves accepted connections open).
        self._connections: set[RemotingConnection] = set()
        # Responses awaited to the server's own requests, by connection and opaque.
        self._asked: dict[RemotingConnection, dict[int, asyncio.Future[RemotingCommand]]] = {}
        self.port = 0
        # The budget each accepted connection holds a descriptor of (``start``).
        self._budgets: dict[RemotingConnection, DescriptorBudget] = {}
        self.refused = 0  # connections closed for want of a descriptor
        self._refusals = LogEvery(log, FAILURE_LOG_EVERY_S)

    async def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        reuse_port: bool = False,
        ssl: SSLContext | None = None,
        budget: DescriptorBudget | None = None,
    ) -> int:
        """Listen; returns the bound port (pass 0 for a free one). Each call adds a
        listening socket (a TLS one with ``ssl``), all served alike. ``reuse_port``: share
        the port with other processes (SO_REUSEPORT), as a proxy's workers do. ``budget``:
        each connection accepted here holds one descriptor of it, and one it has none
        for is closed at once (a socket clients reach directly; behind a front, the
        front's relay holds the budget)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: self._accept(budget), host, port, reuse_port=reuse_port or None, ssl=ssl
        )
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        return self.port

    def _accept(self, budget: DescriptorBudget | None) -> asyncio.Protocol:
        if budget is not None and not budget.take(1):
            self.refused += 1
            self._refusals.warning(
                "closing a connection: the process holds all the descriptors its "
                "open-files limit leaves for clients (%d)", budget.total,
            )  # fmt: skip
            return _Refused()
        conn = RemotingConnection(self._on_command, self._on_lost, self._max_frame)
        self._connections.add(conn)
        if budget is not None:
            self._budgets[conn] = budget
        return conn

    async def stop(self) -> None:
        """Stop listening and close every connection; returns once each is gone. A
        connection closes once it has written out what it holds, which a peer that stopped
        reading never lets it do: past ``close_timeout_s`` such a connection is aborted, so
        a stop (a drain) always ends."""
        servers, self._servers = self._servers, []
        if not servers:
            return
        for server in servers:
            server.close()
        conns = list(self._connections)
        for conn in conns:
            conn.close()
        for futures in self._pending.values():
            for future in futures:
                future.cancel()
        self._pending.clear()
        await self._until_lost(conns)
        self._connections.clear()
        # Every connection is gone now, so the servers close at once (Python 3.12's
        # asyncio waits for the connections here; 3.11's and uvloop's do not).
        await _bounded([server.wait_closed() for server in servers], self._close_timeout_s)

    async def _until_lost(self, conns: list[RemotingConnection]) -> None:
        """Until every one of ``conns`` (closing) is gone; those still there after
        ``close_timeout_s`` are aborted."""
        if await _bounded([conn.wait_lost() for conn in conns], self._close_timeout_s):
            return
        stuck = [conn for conn in conns if not conn.closed]
        log.warning(
            "%d connection(s) did not take what was left to write within %.1f s (their "
            "peers stopped reading): aborted",
            len(stuck), self._close_timeout_s,
        )  # fmt: skip
        for conn in stuck:
            conn.abort()
        await _bounded([conn.wait_lost() for conn in stuck], self._close_timeout_s)

    async def request(
        self, conn: RemotingConnection, cmd: RemotingCommand, timeout: float
    ) -> RemotingCommand:
        """Send a request of our own to the client on ``conn`` and wait at most ``timeout``
        seconds for its response (TimeoutError past it, ConnectionClosedError when the
        connection goes). ``cmd`` gets an opaque of this server's.

        A connection has an entry in the table of awaited answers only while a request of
        ours on it waits: never one for a connection already lost (``_on_lost`` removed
        its entry, and nothing would remove a new one), so the table stays bounded."""
        if conn.closed:
            raise ConnectionClosedError(f"connection with {conn.peer} is closed")
        opaque = cmd.opaque = next(_opaques)
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        asked = self._asked.setdefault(conn, {})
        asked[opaque] = future
        try:
            if not conn.send(cmd):
                raise ConnectionClosedError(f"connection with {conn.peer} is closed")
            return await asyncio.wait_for(future, timeout)
        finally:
            asked.pop(opaque, None)
            if not asked and self._asked.get(conn) is asked:
                del self._asked[conn]

    def send_oneway(self, conn: RemotingConnection, cmd: RemotingCommand) -> bool:
        """Send a one-way request of our own; False when the connection is gone."""
        cmd.opaque = next(_opaques)
        return conn.send(cmd)

    def _on_command(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            waiter = self._asked.get(conn, {}).get(cmd.opaque)
            if waiter is not None and not waiter.done():
                waiter.set_result(cmd)
            return  # a response nobody awaits any more (late) is dropped
        try:
            reply = self._processor(cmd, conn)
        except Exception as exc:
            reply = self._failed(conn, cmd, exc)
        if reply is None or isinstance(reply, RemotingCommand):
            self._answer(conn, cmd, reply)
            return
        future = asyncio.ensure_future(reply) if inspect.isawaitable(reply) else None
        if future is None:
            raise TypeError(f"processor returned {type(reply).__name__}")
        self._pending.setdefault(conn, set()).add(future)
        future.add_done_callback(lambda f: self._finish(conn, cmd, f))

    def _finish(
        self,
        conn: RemotingConnection,
        cmd: RemotingCommand,
        future: asyncio.Future[RemotingCommand | None],
    ) -> None:
        pending = self._pending.get(conn)
        if pending is not None:
            pending.discard(future)
        if future.cancelled():
            return
        exc = future.exception()
        reply: RemotingCommand | None
        if exc is not None:
            reply = self._failed(conn, cmd, exc)
        else:
            reply = future.result()
        self._answer(conn, cmd, reply)

    def _failed(
        self, conn: RemotingConnection, cmd: RemotingCommand, exc: BaseException
    ) -> RemotingCommand:
        """The answer to a request the processor failed on: SYSTEM_ERROR with the error,
        as a broker answers. Logged as one line, at most every ``FAILURE_LOG_EVERY_S``
        (with its traceback at debug level): what fails it most often is a client's body
        that does not parse, and such a client may send it with every request."""
        self._failures.warning(
            "request code %s from %s failed: %s: %s", cmd.code, conn.peer, type(exc).__name__, exc
        )
        log.debug("request code %s failed", cmd.code, exc_info=exc)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _answer(
        conn: RemotingConnection, cmd: RemotingCommand, reply: RemotingCommand | None
    ) -> None:
        if reply is None or cmd.is_oneway:
            return
        reply.opaque = cmd.opaque
        conn.send(reply)

    def _on_lost(self, conn: RemotingConnection, exc: Exception | None) -> None:
        self._connections.discard(conn)
        budget = self._budgets.pop(conn, None)
        if budget is not None:
            budget.give(1)
        for future in self._pending.pop(conn, ()):
            future.cancel()
        for waiter in self._asked.pop(conn, {}).values():
            if not waiter.done():
                waiter.set_exception(ConnectionClosedError(f"connection with {conn.peer} lost"))
        if self._on_closed is not None:
            self._on_closed(conn)


class _Refused(asyncio.Protocol):
    """A connection accepted past the budget: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]  # every stream transport has it


async def _bounded(waits: list[Coroutine[Any, Any, None]], timeout: float) -> bool:
    """Run ``waits`` for at most ``timeout`` seconds: True if all ended, else False (and
    the rest are cancelled)."""
    if not waits:
        return True
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
    finally:
        for task in tasks:
            task.cancel()
    return not pending
