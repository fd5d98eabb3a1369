"""Overload and slow clients: the proxy refuses what is past its limits with a code the
clients understand (TOO_MANY_REQUESTS), holds nothing for clients that stopped reading or
went away, and recovers by itself when the load goes. Waits are bounded; nothing here
asserts how fast the machine is."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from proxy.api import session
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from testkit.lean_client import LeanClient, receive_request
from testkit.waits import wait_until

Code = pb.Code
T, G = "T", "G"


def in_flight(app) -> int:
    return sum(app.engine.status()["in_flight"].values())


async def test_a_burst_past_max_in_flight_is_refused_then_served_again(start_proxy, lean):
    app = await start_proxy(mode="notify", brokers=2, max_in_flight=4)
    client = lean(app)
    # Four long polls on an empty topic hold the limit.
    holders = [
        asyncio.create_task(client.receive(G, T, await_ms=3_000, timeout_s=30)) for _ in range(4)
    ]
    await wait_until(lambda: in_flight(app) == 4, timeout=20)
    burst = await asyncio.gather(
        *(client.receive(G, T, await_ms=3_000, timeout_s=30) for _ in range(20))
    )
    assert {r.status for r in burst} == {Code.TOO_MANY_REQUESTS}
    assert all(r.stream == ["status"] for r in burst)
    assert {r.status for r in await asyncio.gather(*holders)} == {Code.MESSAGE_NOT_FOUND}
    assert in_flight(app) == 0
    # Recovered: a message is delivered to the next poll.
    assert (await client.send(T, b"after the burst")).status.code == Code.OK
    got = await client.receive(G, T, await_ms=3_000, timeout_s=30)
    assert got.status == Code.OK and [m.body for m in got.messages] == [b"after the burst"]


@pytest.mark.slow
async def test_streams_never_read_and_clients_gone_leave_nothing_in_flight(start_proxy, lean):
    """Clients that open ReceiveMessage and never read, and clients that cancel mid-poll:
    every poll ends, the limit frees up, and the messages go back to the queue."""
    app = await start_proxy(
        mode="notify", brokers=2, max_in_flight=64, hand_back_invisible_ms=1_000
    )
    sender = lean(app)
    for i in range(10):
        assert (await sender.send(T, f"m{i}".encode())).status.code == Code.OK
    lazy = [
        LeanClient(f"127.0.0.1:{app.grpc_port}", "lazy", own_connection=True) for _ in range(20)
    ]
    request = receive_request(G, T, await_ms=2_000, batch=32, invisible_ms=10_000)
    calls = []
    for i, client in enumerate(lazy):
        call = client.stub.ReceiveMessage(request, metadata=client.metadata, timeout=30)
        calls.append(call)
        if i % 2:  # half of them give up mid-poll
            await asyncio.sleep(0.05)  # the client's own patience: 50 ms into its poll
            call.cancel()
    await wait_until(lambda: in_flight(app) == 0, timeout=20)
    for client in lazy:
        await client.close()
    # Nothing was acked: every message comes back (delivered to a lazy stream, or handed
    # back when its client went away) and is received by a client that reads.
    seen: set[bytes] = set()
    reader = lean(app)

    async def drain() -> None:
        while len(seen) < 10:
            got = await reader.receive(G, T, await_ms=2_000, batch=32, timeout_s=30)
            seen.update(m.body for m in got.messages)

    await asyncio.wait_for(drain(), timeout=90)
    assert seen == {f"m{i}".encode() for i in range(10)}
    assert in_flight(app) == 0


async def test_many_connections_come_and_go(start_proxy):
    app = await start_proxy(mode="notify", brokers=1)
    endpoint = f"127.0.0.1:{app.grpc_port}"
    before = len(asyncio.all_tasks())
    for _ in range(3):
        clients = [LeanClient(endpoint, f"c{i}", own_connection=True) for i in range(150)]
        routes = await asyncio.gather(*(c.query_route(T) for c in clients))
        assert {r.status.code for r in routes} == {Code.OK}
        await asyncio.gather(*(c.close() for c in clients))
    # The proxy keeps no task per connection once its clients are gone.
    await wait_until(lambda: len(asyncio.all_tasks()) <= before + 2, timeout=20)
    client = LeanClient(endpoint, "after")
    try:
        assert (await client.query_route(T)).status.code == Code.OK
    finally:
        await client.close()


async def test_a_request_over_the_size_limit_is_refused_with_resource_exhausted(start_proxy):
    app = await start_proxy(mode="notify", brokers=1)
    client = LeanClient(f"127.0.0.1:{app.grpc_port}", "big")
    try:
        too_big = b"x" * (4 * app.config.max_body_bytes + (2 << 20))
        try:
            await client.send(T, too_big)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        else:
            raise AssertionError("a request past the gRPC limit was accepted")
        big = await client.send(T, b"x" * (app.config.max_body_bytes + 1))
        assert big.status.code == Code.MESSAGE_BODY_TOO_LARGE
        assert (await client.send(T, b"small")).status.code == Code.OK
    finally:
        await client.close()


def _settings(group: str = G) -> api.TelemetryCommand:
    return api.TelemetryCommand(
        settings=pb.Settings(
            client_type=pb.ClientType.SIMPLE_CONSUMER,
            subscription=pb.Subscription(group=pb.Resource(name=group)),
        )
    )


async def _write_settings(call) -> None:
    """Write settings on a stream the proxy refuses: it answers and ends the stream as it
    opens, without reading, so the write may find the call over (gRPC: INTERNAL, "Failed
    execute_batch"), as a client's would; the answer is what the tests look at."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call.write(_settings())


async def _first_answer(call) -> api.TelemetryCommand | None:
    """The stream's first command, or None when it ended without one."""
    answer = await asyncio.wait_for(call.read(), 20)
    return answer if isinstance(answer, api.TelemetryCommand) else None


async def test_a_client_past_its_telemetry_streams_is_refused_too_many_requests(start_proxy):
    """One client id holds at most STREAMS_PER_CLIENT Telemetry streams: the next one is
    answered TOO_MANY_REQUESTS and ended; other clients are served; once one of its
    streams ends, the client may open another."""
    app = await start_proxy(mode="notify", brokers=1)
    cap = session.STREAMS_PER_CLIENT
    client = LeanClient(f"127.0.0.1:{app.grpc_port}", "leaky")
    other = LeanClient(f"127.0.0.1:{app.grpc_port}", "other")
    try:
        held = []
        for _ in range(cap):
            call = client.stub.Telemetry(metadata=client.metadata)
            await call.write(_settings())
            answer = await _first_answer(call)
            assert answer is not None and answer.status.code == Code.OK
            held.append(call)
        refused = client.stub.Telemetry(metadata=client.metadata)
        await _write_settings(refused)
        answer = await _first_answer(refused)
        assert answer is not None and answer.status.code == Code.TOO_MANY_REQUESTS
        assert await _first_answer(refused) is None  # then its end
        assert await asyncio.wait_for(refused.code(), 20) == grpc.StatusCode.OK
        # Another client is not counted against this one.
        call = other.stub.Telemetry(metadata=other.metadata)
        await call.write(_settings())
        answer = await _first_answer(call)
        assert answer is not None and answer.status.code == Code.OK
        await call.done_writing()
        assert app.session.status()["streams_refused"] == 1
        # One of its streams ends: the client may open another.
        await held[0].done_writing()
        await asyncio.wait_for(held[0].code(), 20)
        await wait_until(lambda: app.session.status()["streams"] == cap - 1, timeout=20)
        again = client.stub.Telemetry(metadata=client.metadata)
        await again.write(_settings())
        answer = await _first_answer(again)
        assert answer is not None and answer.status.code == Code.OK
        for call in [*held[1:], again]:
            await call.done_writing()
        await wait_until(lambda: app.session.status()["clients"] == 0, timeout=20)
    finally:
        await client.close()
        await other.close()


@pytest.mark.parametrize("client_type", ["consumer", "producer"])
async def test_a_telemetry_stream_past_its_pace_is_answered_too_many_requests_and_ended(
    start_proxy, client_type
):
    """A stream that sends more commands than its pace allows (here 3, and no more for
    1,000 s) gets its first ones answered, then TOO_MANY_REQUESTS and its end; another
    stream of the same client is served. A consumer's stream is served inline, a
    producer's by a reader task and an outbox: both paths."""
    app = await start_proxy(mode="notify", brokers=1)
    app.session.command_burst, app.session.commands_per_s = 3, 0.001
    client = LeanClient(f"127.0.0.1:{app.grpc_port}", "chatty")
    if client_type == "consumer":
        settings = _settings()
    else:
        settings = api.TelemetryCommand(
            settings=pb.Settings(
                client_type=pb.ClientType.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name=T)]),
            )
        )
    try:
        call = client.stub.Telemetry(metadata=client.metadata)
        for _ in range(3):
            await call.write(settings)
            answer = await _first_answer(call)
            assert answer is not None and answer.status.code == Code.OK
        await call.write(settings)
        answer = await _first_answer(call)
        assert answer is not None and answer.status.code == Code.TOO_MANY_REQUESTS
        assert await _first_answer(call) is None  # then its end
        assert await asyncio.wait_for(call.code(), 20) == grpc.StatusCode.OK
        assert app.session.status()["streams_too_fast"] == 1
        again = client.stub.Telemetry(metadata=client.metadata)
        await again.write(settings)
        answer = await _first_answer(again)
        assert answer is not None and answer.status.code == Code.OK
        await again.done_writing()
        await wait_until(lambda: app.session.status()["streams"] == 0, timeout=20)
    finally:
        await client.close()


async def test_past_max_telemetry_streams_new_streams_are_refused_too_many_requests(
    start_proxy,
):
    """Clients with ever new ids: past ``max_telemetry_streams`` open at once, a new stream
    is answered TOO_MANY_REQUESTS and ended; once one ends, another is served."""
    app = await start_proxy(mode="notify", brokers=1)
    app.config.max_telemetry_streams = 2
    endpoint = f"127.0.0.1:{app.grpc_port}"
    clients = [LeanClient(endpoint, f"client-{i}") for i in range(4)]
    try:
        held = []
        for client in clients[:2]:
            call = client.stub.Telemetry(metadata=client.metadata)
            await call.write(_settings())
            answer = await _first_answer(call)
            assert answer is not None and answer.status.code == Code.OK
            held.append(call)
        refused = clients[2].stub.Telemetry(metadata=clients[2].metadata)
        await _write_settings(refused)
        answer = await _first_answer(refused)
        assert answer is not None and answer.status.code == Code.TOO_MANY_REQUESTS
        assert await asyncio.wait_for(refused.code(), 20) == grpc.StatusCode.OK
        await held[0].done_writing()
        await asyncio.wait_for(held[0].code(), 20)
        await wait_until(lambda: app.session.status()["streams"] == 1, timeout=20)
        call = clients[3].stub.Telemetry(metadata=clients[3].metadata)
        await call.write(_settings())
        answer = await _first_answer(call)
        assert answer is not None and answer.status.code == Code.OK
        for open_call in (held[1], call):
            await open_call.done_writing()
    finally:
        for client in clients:
            await client.close()
