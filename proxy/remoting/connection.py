"""One remoting connection: frames in, commands out, over an asyncio transport.

The client and the server both use it; they differ only in what they do with a command.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxy.remoting.codes import DEFAULT_MAX_FRAME
from proxy.remoting.command import FrameDecoder, RemotingCommand, RemotingProtocolError, encode

log = logging.getLogger(__name__)


class RemotingConnection(asyncio.Protocol):
    """Decodes frames and hands each command to ``on_command``.

    A frame that cannot be decoded closes this connection only: the peer's other requests
    are lost with it, as they would be with Netty's decoder, but nobody else is affected.
    """

    def __init__(
        self,
        on_command: Callable[[RemotingConnection, RemotingCommand], None],
        on_lost: Callable[[RemotingConnection, Exception | None], None] | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self._on_command = on_command
        self._on_lost = on_lost
        self._decoder = FrameDecoder(max_frame)
        self.transport: asyncio.Transport | None = None
        self.peer: str = "?"
        self.local_port = 0  # its own end's port: on a server, the port it came in on
        self.closed = False
        self._lost: asyncio.Future[None] | None = None  # made by ``wait_lost``

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, so no isinstance check.
        self.transport = transport  # type: ignore[assignment]  # see above: uvloop
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        local = transport.get_extra_info("sockname")
        if local:
            self.local_port = local[1]

    def data_received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except RemotingProtocolError as exc:
            log.warning("closing connection with %s: %s", self.peer, exc)
            self.close()
            return
        for cmd in commands:
            self._on_command(self, cmd)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._on_lost is not None:
            self._on_lost(self, exc)

    def send(self, cmd: RemotingCommand) -> bool:
        """Write a command; False when the connection is already gone."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(encode(cmd))
        return True

    def close(self) -> None:
        """Close once what is written has gone out (which a peer that reads nothing never
        lets happen: ``abort`` then)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is still to be written."""
        if self.transport is not None and not self.closed:
            self.transport.abort()

    async def wait_lost(self) -> None:
        """Until the connection is gone (``connection_lost``)."""
        if self.closed:
            return
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._lost)  # one waiter cancelled leaves the others theirs
