"""RemotingServer on loopback: its stop, and the table of its own requests' answers."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand, encode
from proxy.remoting.server import ConnectionClosedError, RemotingServer
from testkit.waits import wait_until

BIG = 16 * 1024 * 1024  # more than loopback's socket buffers hold: the rest waits in ours


async def test_stop_aborts_a_connection_whose_peer_stopped_reading():
    def answer(cmd, conn):
        return cmd.make_response(ResponseCode.SUCCESS, body=b"x" * BIG)

    server = RemotingServer(answer, close_timeout_s=0.2)
    port = await server.start()
    peer = socket.create_connection(("127.0.0.1", port))
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        peer.sendall(encode(RemotingCommand(code=11)))  # then never reads
        (conn,) = await _connections(server)
        assert conn.transport is not None
        transport = conn.transport
        await wait_until(lambda: transport.get_write_buffer_size() > 0, timeout=5)
        await asyncio.wait_for(server.stop(), 5)  # no deadline: forever (3.12+)
        assert conn.closed  # gone, not left writing to a peer that reads nothing
    finally:
        peer.close()


async def test_stop_waits_for_a_reading_peer_to_get_what_was_written():
    answered: list[int] = []

    def answer(cmd, conn):
        answered.append(cmd.code)
        return cmd.make_response(ResponseCode.SUCCESS, body=b"y" * BIG)

    server = RemotingServer(answer)
    port = await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode(RemotingCommand(code=11)))
        await writer.drain()
        (conn,) = await _connections(server)
        await wait_until(lambda: answered == [11], timeout=5)
        # The answer is still being written: the stop waits for it, under its deadline.
        read = asyncio.ensure_future(reader.read())
        await asyncio.wait_for(server.stop(), 5)
        assert conn.closed
        data = await asyncio.wait_for(read, 5)  # the whole answer, then EOF
        assert len(data) > BIG and data.endswith(b"y" * 1024)
    finally:
        writer.close()


async def _connections(server: RemotingServer) -> list:
    await wait_until(lambda: len(server._connections) == 1, timeout=5)
    return list(server._connections)


async def test_the_table_of_awaited_answers_keeps_no_connection_without_a_request():
    server = RemotingServer(lambda cmd, conn: None)
    port = await server.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        (conn,) = await _connections(server)
        # A request nobody answers: its entry goes with it.
        with pytest.raises(TimeoutError):
            await server.request(conn, RemotingCommand(code=39), 0.05)
        assert server._asked == {}
        # The connection lost: a request on it fails, and makes no entry again.
        writer.close()
        await wait_until(lambda: conn.closed, timeout=5)
        for _ in range(3):
            with pytest.raises(ConnectionClosedError):
                await server.request(conn, RemotingCommand(code=39), 1.0)
        assert server._asked == {}
        # Lost while a request waits: the request fails at once, and no entry stays.
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await wait_until(lambda: len(server._connections) == 1, timeout=5)
        (conn,) = server._connections
        waiting = asyncio.ensure_future(server.request(conn, RemotingCommand(code=39), 30))
        await wait_until(lambda: conn in server._asked, timeout=5)
        writer.close()
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(waiting, 5)
        assert server._asked == {}
    finally:
        await server.stop()


async def test_a_failing_request_is_answered_and_logged_as_one_throttled_line(caplog):
    def fails(cmd, conn):
        if cmd.code == 1:
            raise TypeError("'int' object is not iterable")  # say, a body of the wrong shape

        async def later():
            raise KeyError("mqSet")

        return later()

    caplog.set_level(logging.DEBUG, logger="proxy.remoting.server")
    server = RemotingServer(fails)
    port = await server.start()
    client = RemotingClient(f"127.0.0.1:{port}")
    try:
        for code in [1, 2] * 10:
            answer = await client.invoke(RemotingCommand(code=code), 5)
            assert answer.code == ResponseCode.SYSTEM_ERROR
            assert answer.remark in ("TypeError: 'int' object is not iterable", "KeyError: 'mqSet'")
    finally:
        await client.close()
        await server.stop()
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # 20 failures, one line
    (line,) = lines
    assert line.exc_info is None  # and no traceback
    message = line.getMessage()
    assert message.startswith("request code 1 from 127.0.0.1:"), message
    assert message.endswith(" failed: TypeError: 'int' object is not iterable"), message
