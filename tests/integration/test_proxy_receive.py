"""The receive engine through the gRPC API: the mission's case, modes, adaptive switching,
statelessness and delivery safety."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.api.v2 import definition_pb2 as pb
from proxy.brokers import BrokerPool
from proxy.config import ReceiveConfig
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from proxy.receive.types import ReceiveRequest
from tests.integration._util import send_to

OK = pb.Code.OK
NOT_FOUND = pb.Code.MESSAGE_NOT_FOUND
T, G = "T", "G"


async def receive_with_late_send(app, lean, await_ms: int, delay_s: float = 0.3):
    """The consumer's first pop hits broker-a; a message lands on broker-c later."""
    consumer = lean(app)
    started = time.perf_counter()
    poll = asyncio.ensure_future(consumer.receive(G, T, await_ms=await_ms, broker="broker-a"))
    await asyncio.sleep(delay_s)
    await send_to(app, "broker-c", b"late")
    sent = time.perf_counter()
    result = await poll
    return result, time.perf_counter() - sent, time.perf_counter() - started


async def test_notify_delivers_a_message_from_another_broker_at_once(start_proxy, lean):
    app = await start_proxy(mode="notify")
    result, after_send, total = await receive_with_late_send(app, lean, await_ms=3000)
    assert result.status == OK
    assert [m.body for m in result.messages] == [b"late"]
    assert after_send < 0.5, f"took {after_send:.3f}s after the send"
    assert total < 1.5  # well before the 3 s poll time


async def test_coupled_answers_empty_while_the_message_waits_elsewhere(start_proxy, lean):
    app = await start_proxy(mode="coupled")
    result, _, total = await receive_with_late_send(app, lean, await_ms=2000)
    assert result.status == NOT_FOUND  # the false empty this project exists to avoid
    assert total >= 1.9
    # Nothing was lost: the next poll finds it.
    again = await lean(app).receive(G, T, await_ms=1000, broker="broker-c")
    assert [m.body for m in again.messages] == [b"late"]


async def test_slicing_finds_it_on_a_later_slice(start_proxy, lean):
    app = await start_proxy(mode="slicing", slice_ms=100, slice_quota=20)
    result, after_send, _ = await receive_with_late_send(app, lean, await_ms=3000)
    assert [m.body for m in result.messages] == [b"late"]
    assert after_send < 1.0  # within a few slices, not the whole poll


async def test_first_pop_hit_is_a_short_polling_hit(start_proxy, lean):
    app = await start_proxy(mode="notify")
    await send_to(app, "broker-b", b"waiting")
    result = await lean(app).receive(G, T, await_ms=2000, broker="broker-b")
    assert [m.body for m in result.messages] == [b"waiting"]
    assert result.stream[0] == "status" and result.stream[-1] == "delivery_timestamp"
    status = app.engine.status()
    assert status["probes_sent"] == 0  # found by the first pop: no probe needed


async def test_adaptive_switches_to_coupled_above_the_threshold_and_back(start_proxy, lean):
    app = await start_proxy(
        mode="adaptive", adaptive_high_rate=4.0, adaptive_low_rate=1.0, adaptive_window_s=2.0
    )
    client = lean(app)
    modes = []
    for _ in range(12):  # 12 requests in well under 2 s: 6/s > 4/s
        await send_to(app, "broker-a", b"m")
        await client.receive(G, T, await_ms=500, broker="broker-a")
        modes.append(app.engine.switch.snapshot(time.monotonic())[0]["mode"])
    assert modes[0] == "notify" and modes[-1] == "coupled"
    assert app.metrics is not None
    body = (app.metrics.render()[0]).decode()
    assert 'rocketmq_proxy_mode_switches_total{group="G",to="coupled",topic="T"} 1.0' in body
    await asyncio.sleep(2.5)  # the window empties: back to notify on the next request
    await client.receive(G, T, await_ms=300)
    snapshot = app.engine.switch.snapshot(time.monotonic())
    assert snapshot[0]["mode"] == "notify"
    body = (app.metrics.render()[0]).decode()
    assert 'rocketmq_proxy_mode_switches_total{group="G",to="notify",topic="T"} 1.0' in body


async def test_receive_through_one_proxy_ack_through_another(start_proxy, lean):
    first = await start_proxy(mode="notify")
    second = await start_proxy(mode="notify", namesrv=first.cluster.namesrv_address)
    await send_to(first, "broker-b", b"stateless")
    got = await lean(first).receive(G, T, await_ms=1000, invisible_ms=10_000)
    assert [m.body for m in got.messages] == [b"stateless"]
    acked = await lean(second).ack(G, T, got.messages)
    assert acked.status.code == OK and acked.entries[0].status.code == OK
    assert first.cluster.broker("broker-b").pop.checkpoint_count == 0  # acked on the broker


async def test_a_cancelled_poll_loses_nothing(start_proxy, lean):
    """Coupled mode parks the pop on the broker; the client leaves; a message then arrives
    into that parked pop. The proxy hands it back at once, so the next receive gets it in
    about a second, not after its 30 s invisible time."""
    app = await start_proxy(mode="coupled", nack_invisible_ms=500)
    consumer = lean(app)
    poll = asyncio.ensure_future(consumer.receive(G, T, await_ms=5000, broker="broker-a"))
    await asyncio.sleep(0.3)
    poll.cancel()
    await asyncio.gather(poll, return_exceptions=True)
    await asyncio.sleep(0.1)  # the cancellation reaches the proxy
    await send_to(app, "broker-a", b"precious")
    sent = time.perf_counter()
    found = []
    while not found and time.perf_counter() - sent < 5:
        result = await lean(app).receive(G, T, await_ms=1000, invisible_ms=30_000)
        found = result.messages
    assert [m.body for m in found] == [b"precious"]
    assert time.perf_counter() - sent < 3.0
    assert found[0].system_properties.delivery_attempt == 2  # handed back once
    assert app.engine.nacked == 1


async def test_a_broker_that_is_down_is_skipped(start_proxy, lean):
    app = await start_proxy(mode="notify")
    consumer = lean(app)
    await consumer.query_route(T)  # the proxy learns all three brokers
    await app.cluster.broker("broker-b").stop()
    started = time.perf_counter()
    poll = asyncio.ensure_future(consumer.receive(G, T, await_ms=3000, broker="broker-b"))
    await asyncio.sleep(0.3)
    await send_to(app, "broker-c", b"around the hole")
    result = await poll
    assert [m.body for m in result.messages] == [b"around the hole"]
    assert time.perf_counter() - started < 1.5
    empty = await consumer.receive(G, T, await_ms=500, broker="broker-b")
    assert empty.status == NOT_FOUND  # answered on time, not stalled by the dead broker


async def test_finished_polls_leave_nothing_in_flight(start_proxy, lean):
    app = await start_proxy(mode="notify")
    consumer = lean(app)
    polls = [consumer.receive(G, T, await_ms=400) for _ in range(5)]
    await asyncio.gather(*polls)
    status = app.engine.status()
    assert status["in_flight"] == {"notify": 0}
    assert status["probe_watchers"] == 0


async def test_coupled_poll_refused_by_a_full_broker_is_too_many_requests():
    """A broker that will not park another pop must not turn into an empty answer at once
    (the client would poll again at once): the client is told to back off."""
    async with StubCluster(1, template=BrokerConfig(topics=[T], polling_per_key=1)) as stub:
        pool = BrokerPool([stub.namesrv_address])
        engine = ReceiveEngine(ReceiveConfig(mode="coupled"), pool)
        loop = asyncio.get_running_loop()

        def request() -> ReceiveRequest:
            now = loop.time()
            return ReceiveRequest(G, T, "*", 16, 30_000, 1000, now + 1.0, now, 0, True)

        try:
            first = asyncio.ensure_future(engine.receive(request()))
            await asyncio.sleep(0.2)  # parked on the broker: the key is now full
            with pytest.raises(TooManyRequests):
                await engine.receive(request())
            assert (await first).messages == []
        finally:
            await engine.close()
            await pool.close()
