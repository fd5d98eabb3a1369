"""Broker-side helpers: a message's checkpoint, a send that bypasses the proxy, and a
scripted remoting server for broker or name-server answers no real part gives on demand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.command import FrameDecoder, RemotingCommand, encode
from proxy.remoting.message import MessageExt, Prop
from proxy.remoting.popinfo import PopCheckpointInfo


def checkpoint(msg: MessageExt) -> PopCheckpointInfo:
    return PopCheckpointInfo.parse(msg.properties[Prop.POP_CK])


async def send_to(app, broker_name: str, body: bytes, topic: str = "T") -> None:
    """Send straight to one embedded broker of a ProxyApp, bypassing the proxy."""
    broker = app.cluster.broker(broker_name)
    client = BrokerClient(broker.name, broker.address)
    try:
        await client.send(topic, body)
    finally:
        await client.close()


class ScriptedServer:
    """A remoting server on a free loopback port that answers every request with
    ``answer(request)``, or not at all when that is None (a hung peer); ``async with``
    yields its address and closes it after."""

    def __init__(self, answer: Callable[[RemotingCommand], RemotingCommand | None]) -> None:
        self.answer = answer
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0  # once started

    def drop_connections(self) -> None:
        """Close every connection, as a peer that restarted has."""
        for writer in self._writers:
            writer.close()

    def die(self) -> None:
        """Stop listening and drop every connection, as a SIGKILLed broker: new
        connections are refused until ``revive``."""
        self.server.close()
        self.drop_connections()

    async def revive(self) -> None:
        """Listen again on the same port, as the broker restarted."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{self.port}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        self._writers.add(writer)
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            while data := await reader.read(65536):
                for cmd in decoder.feed(data):
                    if (response := self.answer(cmd)) is not None:
                        writer.write(encode(response))
        self._writers.discard(writer)
        writer.close()
