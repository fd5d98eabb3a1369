"""A burst of calls the gRPC server has not asked for yet (issue 40): grpcio holds up to
1,000 of them and cancels a growing share beyond (CANCELLED, before any handler). The
proxy's server raises those limits (``pending_calls_options``); with them, a burst of
3,000 calls at once on 4 connections reaches the handler whole."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.app import pending_calls_options
from testkit.lean_client import receive_request

CALLS = 3_000
CONNECTIONS = 4


class Briefly(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self) -> None:
        self.seen = 0

    async def ReceiveMessage(self, request, context):
        self.seen += 1
        await asyncio.sleep(1.0)
        yield api.ReceiveMessageResponse()


def test_the_limits_are_grpcios_names_and_above_the_proxys_own_bound():
    options = dict(pending_calls_options(20_000))
    assert options == {
        "grpc.server.max_pending_requests": 40_000,
        "grpc.server.max_pending_requests_hard_limit": 40_000,
    }
    assert min(dict(pending_calls_options(10)).values()) >= 2_000  # never below the default


@pytest.mark.slow  # 3,000 calls: 5-10 s on 2 loaded cores
async def test_a_burst_of_calls_reaches_the_handler_whole():
    server = grpc.aio.server(options=pending_calls_options(20_000))
    service = Briefly()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("bench.connection", i + 1)])
        for i in range(CONNECTIONS)
    ]
    try:
        stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]
        request = receive_request("G", "T", await_ms=1000, batch=1)
        ended: Counter[str] = Counter()

        async def one(i: int) -> None:
            try:
                async for _ in stubs[i % CONNECTIONS].ReceiveMessage(request, timeout=60):
                    pass
                ended["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                ended[exc.code().name] += 1

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(CALLS))), 90)
        assert ended == {"OK": CALLS}
        assert service.seen == CALLS
    finally:
        for channel in channels:
            await channel.close(None)
        await server.stop(None)
