"""The front under an open-files limit, in a proxy process of its own (limits are the
process's): it opens as many relays as the limit leaves room for, refuses the clients past
them at once, logged and counted, and serves the clients it kept; a place that frees up
serves a new client."""

from __future__ import annotations

import asyncio
import resource
import sys

import aiohttp
import grpc

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.descriptors import FD_RESERVE
from proxy.security.front import FDS_PER_RELAY
from testkit.metrics_text import total
from testkit.processes import terminate
from testkit.waits import wait_until
from tests.support.proxy_process import ready_line

RELAYS = 6
LIMIT = FD_RESERVE + FDS_PER_RELAY * RELAYS  # max(256, LIMIT // 8) = 256 kept


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _channel(address: str) -> grpc.aio.Channel:
    # A connection of its own, each.
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


async def _served(channel: grpc.aio.Channel) -> bool:
    """Whether a QueryRoute gets an answer (a gRPC error raises)."""
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    request = api.QueryRouteRequest(topic=pb.Resource(name="T"))
    answer = await stub.QueryRoute(request, timeout=5)
    return answer.status.code > 0


async def test_clients_past_the_relay_limit_are_refused_counted_and_logged(tmp_path):
    log_path = tmp_path / "proxy.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy.cli", "--workers", "1", "--embedded-brokers", "1",
            "--topic", "T", "--grpc-port", "0", "--http-port", "0", "--log-level", "warning",
            stdout=asyncio.subprocess.PIPE, stderr=log, preexec_fn=_low_limit,
        )  # fmt: skip
    channels: list[grpc.aio.Channel] = []
    try:
        fields = await ready_line(proc, 60)
        address, http = fields["grpc"], fields["http"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

            async def front() -> dict:
                async with session.get(f"http://{http}/v1/status") as r:
                    return (await r.json())["security"]["front"]

            assert (await front())["max_relays"] == RELAYS
            kept = [_channel(address) for _ in range(RELAYS)]
            channels += kept
            for channel in kept:
                assert await _served(channel)
            turned_away = [_channel(address) for _ in range(3)]
            channels += turned_away
            for channel in turned_away:
                try:
                    await _served(channel)
                    raise AssertionError("a client past the relay limit was served")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc
            status = await front()
            assert status["refused_limit"] >= 3 and status["open"] == RELAYS, status
            async with session.get(f"http://{http}/metrics") as r:
                text = await r.text()
            refused = total(text, "rocketmq_proxy_front_connections_total", result="refused_limit")
            assert refused >= 3
            for channel in kept:  # the clients it kept are served on
                assert await _served(channel)
            await kept.pop().close(None)  # a place frees up

            async def freed() -> bool:
                return (await front())["open"] < RELAYS

            await wait_until(freed, timeout=10, step=0.1)
            newcomer = _channel(address)
            channels.append(newcomer)
            assert await _served(newcomer)
    finally:
        for channel in channels:
            await channel.close(None)
        await terminate(proc, 30)
    text = log_path.read_text()
    assert f"{RELAYS} relays are open, as many as the open-files limit" in text, text
    assert "Too many open files" not in text, text
