"""An asyncio remoting client: one connection per peer, requests matched by ``opaque``.

- Every request has a deadline; a late response is dropped.
- A lost connection fails its requests at once; the next request reconnects.
- After a failed connect the peer is skipped for a back-off period (doubling up to a cap),
  so a broker that is down costs callers nothing but a fast error.
- A ``request_hook`` sees every request just before it is sent (the broker ACL signature,
  ``proxy.security.signing.RemotingSigner``).
- Brokers also send requests to their clients on the same connection (a producer group's
  CHECK_TRANSACTION_STATE): a ``server_handler`` sees each; without one, or when it
  returns None for a two-way request, the peer is told the code is not supported. A
  handler may return a coroutine (its answer needs a client's reply): it runs as a task
  the client owns, bounded by ANSWER_TIMEOUT_S, and its answer is sent when it is done.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from proxy.remoting.codes import DEFAULT_MAX_FRAME, FLAG_ONEWAY
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection

log = logging.getLogger(__name__)

_opaques = itertools.count(1)

# Called with every request just before it is sent; may add fields (a signature).
RequestHook = Callable[[RemotingCommand], None]

# Called with every request a peer sends us; returns the response of a two-way request, or
# None (not supported, or nothing to answer for a one-way request).
ServerAnswer = RemotingCommand | Coroutine[Any, Any, RemotingCommand] | None
ServerHandler = Callable[[RemotingCommand], ServerAnswer]
# How long a handler's answer that needs awaiting may take (a client asked over its stream).
ANSWER_TIMEOUT_S = 10.0


class RemotingError(Exception):
    """A request could not be completed."""


class RemotingConnectError(RemotingError):
    """The peer cannot be reached (connect failed, connection lost, or in back-off)."""


class RemotingTimeoutError(RemotingError):
    """The peer did not answer before the request's deadline."""


def split_address_list(text: str) -> list[str]:
    """A list of name servers as RocketMQ writes it (``namesrvAddr``: ``host:port;host:port``),
    commas accepted too; blanks dropped. Every command line that takes one reads it here."""
    return [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingClient:
    """A client of one remoting peer (a broker or a name server)."""

    def __init__(
        self,
        address: str,
        *,
        connect_timeout: float = 3.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        request_hook: RequestHook | None = None,
        server_handler: ServerHandler | None = None,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        """``on_connect`` is called each time a connection is made, the first and every
        one after a loss: what a peer knows of us per connection (a broker's producer
        channels) must be told again on the new one."""
        self.address = address
        self.request_hook = request_hook
        self.server_handler = server_handler
        self.on_connect = on_connect
        self._host, self._port = split_address(address)
        self._connect_timeout = connect_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._backoff = backoff_initial
        self._retry_at = 0.0
        self._max_frame = max_frame
        self._conn: RemotingConnection | None = None
        self._connecting: asyncio.Task[RemotingConnection] | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._late: dict[int, Callable[[RemotingCommand], None]] = {}
        self.late_window = 60.0
        self._closed = False
        self._answering: set[asyncio.Task[None]] = set()  # handlers' answers being awaited

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def invoke(
        self,
        request: RemotingCommand,
        timeout: float,
        on_late: Callable[[RemotingCommand], None] | None = None,
    ) -> RemotingCommand:
        """Send ``request`` and wait at most ``timeout`` seconds for its response.

        ``on_late`` receives a response that arrives after the deadline (within
        ``late_window`` seconds): a pop that answers late still holds messages someone must
        hand back.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._connection(deadline)
        opaque = request.opaque = next(_opaques)
        if self.request_hook is not None:
            self.request_hook(request)
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[opaque] = future
        timer = loop.call_at(deadline, self._expire, opaque, timeout, on_late)
        try:
            if not conn.send(request):
                raise RemotingConnectError(f"connection to {self.address} is closed")
            return await future
        finally:
            timer.cancel()
            self._pending.pop(opaque, None)

    async def invoke_oneway(self, request: RemotingCommand, timeout: float = 3.0) -> None:
        """Send without waiting for (or getting) a response."""
        loop = asyncio.get_running_loop()
        conn = await self._connection(loop.time() + timeout)
        request.opaque = next(_opaques)
        request.flag |= FLAG_ONEWAY
        if self.request_hook is not None:
            self.request_hook(request)
        if not conn.send(request):
            raise RemotingConnectError(f"connection to {self.address} is closed")

    async def close(self) -> None:
        self._closed = True
        for task in list(self._answering):
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)
        if self._connecting is not None:
            self._connecting.cancel()
        if self._conn is not None:
            self._conn.close()
        self._fail_pending(RemotingConnectError(f"client of {self.address} closed"))

    # -- connection management ----------------------------------------------------------

    async def _connection(self, deadline: float) -> RemotingConnection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._closed:
            raise RemotingConnectError(f"client of {self.address} is closed")
        loop = asyncio.get_running_loop()
        if self._connecting is None:
            if loop.time() < self._retry_at:
                raise RemotingConnectError(f"{self.address} is unreachable (backing off)")
            self._connecting = loop.create_task(self._connect())
        remaining = deadline - loop.time()
        try:
            # shield: one caller's deadline must not cancel the connect others wait for.
            return await asyncio.wait_for(asyncio.shield(self._connecting), max(remaining, 0))
        except TimeoutError:
            raise RemotingTimeoutError(f"connect to {self.address} timed out") from None

    async def _connect(self) -> RemotingConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: RemotingConnection(self._on_command, self._on_lost, self._max_frame),
                    self._host,
                    self._port,
                ),
                self._connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            self._retry_at = loop.time() + self._backoff
            log.info("connect to %s failed (%s); retry in %.1fs", self.address, exc, self._backoff)
            self._backoff = min(self._backoff * 2, self._backoff_max)
            raise RemotingConnectError(f"cannot connect to {self.address}: {exc}") from None
        finally:
            self._connecting = None
        self._backoff = self._backoff_initial
        self._conn = conn
        if self.on_connect is not None:
            try:
                self.on_connect()
            except Exception:  # a listener's bug must not fail the call that connected
                log.exception("on_connect of %s failed", self.address)
        return conn

    def _on_command(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        if not cmd.is_response:
            response = None
            if self.server_handler is not None:
                try:
                    response = self.server_handler(cmd)
                except Exception:  # a handler's bug must not take the connection down
                    log.exception("handling request %d from %s", cmd.code, self.address)
            if asyncio.iscoroutine(response):
                task = asyncio.get_running_loop().create_task(self._answer(conn, cmd, response))
                self._answering.add(task)
                task.add_done_callback(self._answering.discard)
                return
            if not cmd.is_oneway:
                if response is None:
                    response = cmd.make_response(
                        3, remark=f" request type {cmd.code} not supported"
                    )
                response.opaque = cmd.opaque
                conn.send(response)
            return
        future = self._pending.pop(cmd.opaque, None)
        if future is not None and not future.done():
            future.set_result(cmd)
        elif future is None and cmd.opaque in self._late:
            self._late.pop(cmd.opaque)(cmd)

    async def _answer(
        self,
        conn: RemotingConnection,
        cmd: RemotingCommand,
        answer: Coroutine[Any, Any, RemotingCommand],
    ) -> None:
        """Send what a handler's coroutine answers to ``cmd`` (nothing for a one-way one)."""
        try:
            response = await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)
        except TimeoutError:
            response = cmd.make_response(1, remark="no answer in time")
        except Exception as exc:  # a handler's failure is the peer's error, not ours
            log.exception("answering request %d from %s", cmd.code, self.address)
            response = cmd.make_response(1, remark=f"{type(exc).__name__}: {exc}")
        if not cmd.is_oneway and not conn.closed:
            response.opaque = cmd.opaque
            conn.send(response)

    def _on_lost(self, conn: RemotingConnection, exc: Exception | None) -> None:
        if self._conn is conn:
            self._conn = None
        self._fail_pending(RemotingConnectError(f"connection to {self.address} lost: {exc}"))

    def _fail_pending(self, error: RemotingError) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def _expire(
        self, opaque: int, timeout: float, on_late: Callable[[RemotingCommand], None] | None
    ) -> None:
        future = self._pending.pop(opaque, None)
        if on_late is not None:
            self._late[opaque] = on_late
            asyncio.get_running_loop().call_later(self.late_window, self._late.pop, opaque, None)
        if future is not None and not future.done():
            future.set_exception(
                RemotingTimeoutError(f"no answer from {self.address} within {timeout:.3f}s")
            )
