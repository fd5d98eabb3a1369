"""The receive engine through the gRPC API: the mission's case, modes, adaptive switching,
statelessness and delivery safety."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.api.v2 import definition_pb2 as pb
from proxy.brokers import BrokerPool
from proxy.config import ReceiveConfig, ReceiveMode
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from proxy.receive.types import ReceiveRequest
from testkit.waits import wait_until
from tests.integration.test_proxy_observability import value
from tests.support.brokers import send_to

OK = pb.Code.OK
NOT_FOUND = pb.Code.MESSAGE_NOT_FOUND
T, G = "T", "G"


# The mission's bound: a message on another broker reaches a parked notify poll well under
# a second after it was sent. The stubs answer in milliseconds, so they are held to less.
DELIVERY_BOUND_S = {"stub": 0.5, "real": 1.0}
# A message handed back becomes visible again in this time, not its 30 s invisible time.
HAND_BACK_BOUND_S = {"stub": 3.0, "real": 10.0}
# A late message found by a later 100 ms slice, well before the 3 s poll ends. A slice on
# a real broker is a POP parked there, answered by its 20 ms expiry scan and a round trip:
# the late delivery took 1.4 s on real brokers at load 10 (under 1 s on the stubs).
SLICE_BOUND_S = {"stub": 1.0, "real": 2.0}


TIMELINE_LOGGER = "proxy.receive.timeline"


def poll_timelines(caplog) -> str:
    """The timelines the proxy logged for this test's polls (``proxy/receive/timeline.py``),
    for a failure's message."""
    lines = [r.getMessage() for r in caplog.records if r.name == TIMELINE_LOGGER]
    return " | ".join(lines) or "no timeline logged"


async def parked(app, mode: str) -> None:
    """Wait until the one poll in flight has made its first pop and is waiting: probes
    parked on both brokers (notify), or its pop sent to the broker (coupled, slicing)."""
    if mode in ("notify", "adaptive"):
        await wait_until(lambda: app.engine.hub.probes_in_flight == 2, timeout=5)
    else:
        await wait_until(lambda: any(c.pops for c in app.engine._polls), timeout=5)
    # The broker parks what it was sent; nothing counts a parked NOTIFICATION on a real
    # broker (POLLING_INFO counts pops only, conformance/test_polling.py) to wait on.
    await asyncio.sleep(0.2)


async def receive_with_late_send(backend, app, lean, mode: str, await_ms: int, to="broker-b"):
    """The consumer's first pop goes to broker-a (the queue it names); once the poll waits,
    a message lands on broker ``to``. Returns the result, the seconds from the send to the
    answer, and the seconds of the whole poll."""
    consumer = lean(app)
    started = time.perf_counter()
    poll = asyncio.ensure_future(
        consumer.receive(backend.group, backend.topic, await_ms=await_ms, broker="broker-a")
    )
    await parked(app, mode)
    await backend.send_to(to, b"late")
    sent = time.perf_counter()
    result = await poll
    return result, time.perf_counter() - sent, time.perf_counter() - started


@pytest.mark.parametrize("mode", ["notify", "adaptive"])
async def test_notify_delivers_a_message_from_another_broker_at_once(backend, lean, mode, caplog):
    """The mission's case. Adaptive on a quiet group polls as notify does. The poll may wait
    5 s, so that a first pop slowed by a loaded machine leaves it time to park; what is held
    to the bound is the time from the send to the answer."""
    caplog.set_level(logging.DEBUG, logger=TIMELINE_LOGGER)
    app = await backend.start(mode=mode)
    result, after_send, total = await receive_with_late_send(backend, app, lean, mode, 5000)
    story = f"after the send {after_send:.3f}s, poll {total:.3f}s; {poll_timelines(caplog)}"
    assert result.status == OK, story
    assert [m.body for m in result.messages] == [b"late"]
    assert result.messages[0].system_properties.receipt_handle.split(" ")[5] == "broker-b"
    assert after_send < DELIVERY_BOUND_S[backend.kind], story
    assert total < 4.5, story  # well before the 5 s poll time
    assert app.engine.switch.current(backend.group, backend.topic) == "notify"
    assert app.engine.hub.probes_sent >= 2  # it did probe both brokers


async def test_coupled_answers_empty_while_the_message_waits_elsewhere(backend, lean):
    app = await backend.start(mode="coupled")
    result, _, total = await receive_with_late_send(backend, app, lean, "coupled", 2000)
    assert result.status == NOT_FOUND  # the false empty this project exists to avoid
    assert total >= 1.9
    # Nothing was lost: the next poll, on the broker that has it, finds it.
    again = await lean(app).receive(backend.group, backend.topic, await_ms=1000, broker="broker-b")
    assert [m.body for m in again.messages] == [b"late"]


async def test_slicing_finds_it_on_a_later_slice(backend, lean):
    app = await backend.start(mode="slicing", slice_ms=100, slice_quota=20)
    result, after_send, _ = await receive_with_late_send(backend, app, lean, "slicing", 3000)
    assert [m.body for m in result.messages] == [b"late"]
    assert after_send < SLICE_BOUND_S[backend.kind]  # a few slices, not the whole poll


@pytest.mark.parametrize("mode", ["notify", "coupled", "slicing", "adaptive"])
async def test_every_mode_delivers_a_message_sent_while_it_waits(backend, lean, mode):
    """A message for the broker the poll started on, sent while the poll waits."""
    app = await backend.start(mode=mode, slice_ms=100)
    result, _, total = await receive_with_late_send(backend, app, lean, mode, 3000, "broker-a")
    assert result.status == OK and [m.body for m in result.messages] == [b"late"]
    assert total < 2.5
    acked = await lean(app).ack(backend.group, backend.topic, result.messages)
    assert acked.status.code == OK


async def test_first_pop_hit_is_a_short_polling_hit(backend, lean):
    app = await backend.start(mode="notify")
    await backend.send_to("broker-b", b"waiting")
    result = await lean(app).receive(backend.group, backend.topic, await_ms=2000, broker="broker-b")
    assert [m.body for m in result.messages] == [b"waiting"]
    assert result.stream[0] == "status" and result.stream[-1] == "delivery_timestamp"
    status = app.engine.status()
    assert status["probes_sent"] == 0  # found by the first pop: no probe needed


async def test_adaptive_switches_to_coupled_above_the_threshold_and_back(start_proxy, lean):
    app = await start_proxy(
        mode="adaptive",
        adaptive_high_rate=4.0,
        adaptive_low_rate=1.0,
        adaptive_window_s=2.0,
        adaptive_min_polls=5,
    )
    client = lean(app)
    modes = []
    # 12 requests in well under 2 s (6/s > 4/s), each finding its message with the first
    # pop: after 5 such polls the evidence says coupled polling pays.
    for _ in range(12):
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


async def test_a_parked_coupled_poll_reports_its_miss_before_it_ends(start_proxy, lean):
    """The switch hears a coupled poll's miss 10 ms after it parked, not when it ends."""
    app = await start_proxy(
        mode="adaptive",
        adaptive_high_rate=4.0,
        adaptive_low_rate=1.0,
        adaptive_window_s=2.0,
        adaptive_min_polls=2,
    )
    client = lean(app)
    for _ in range(12):
        await send_to(app, "broker-a", b"m")
        await client.receive(G, T, await_ms=500, broker="broker-a")
    switch = app.engine.switch
    assert switch.current(G, T) == "coupled"
    ratio = switch.snapshot(time.monotonic())[0]["hit_ratio"]
    poll = asyncio.ensure_future(client.receive(G, T, await_ms=3000, broker="broker-a"))
    await wait_until(lambda: app.engine.status()["in_flight"].get("coupled") == 1)
    # Weight 1/2: one miss halves the moving average while the poll is still parked.
    await wait_until(
        lambda: abs(switch.snapshot(time.monotonic())[0]["hit_ratio"] - ratio / 2) < 0.002
    )
    assert not poll.done()
    await send_to(app, "broker-a", b"late")
    assert [m.body for m in (await poll).messages] == [b"late"]


async def test_adaptive_keeps_idle_polls_at_a_high_rate_in_notify(start_proxy, lean):
    """Many idle consumers: the rate is far above the threshold, but no first pop finds
    anything, so every poll is served by notify and no pop is parked on a broker."""
    app = await start_proxy(
        mode="adaptive",
        adaptive_high_rate=2.0,
        adaptive_low_rate=1.0,
        adaptive_window_s=2.0,
        adaptive_min_polls=5,
    )
    clients = [lean(app, f"idle-{i}") for i in range(8)]
    for _ in range(3):  # 24 requests in about 1 s: 12/s > 2/s, all empty
        answers = await asyncio.gather(*(c.receive(G, T, await_ms=300) for c in clients))
        assert all(a.status == NOT_FOUND for a in answers)
    (entry,) = app.engine.switch.snapshot(time.monotonic())
    assert entry["rate"] > 2.0 and entry["polls"] == 24 and entry["hit_ratio"] == 0.0
    assert entry["mode"] == "notify"
    body = (app.metrics.render()[0]).decode()
    assert 'rocketmq_proxy_receive_total{group="G",is_long_polling' in body
    assert 'mode="coupled"' not in body


async def test_adaptive_thresholds_file_is_loaded_and_reloaded(start_proxy, lean, tmp_path):
    path = tmp_path / "thresholds.json"

    def write(high: float, low: float) -> None:
        entry = {"group": G, "topic": T, "high_rate": high, "low_rate": low}
        tmp = tmp_path / "next.json"
        tmp.write_text(json.dumps({"thresholds": [entry]}))
        tmp.replace(path)

    write(3.0, 1.0)
    app = await start_proxy(
        mode="adaptive",
        adaptive_thresholds_file=str(path),
        adaptive_thresholds_check_s=0.05,
        adaptive_window_s=2.0,
        adaptive_min_polls=5,
    )
    switch = app.engine.switch
    assert switch.thresholds(G, T).high_rate == 3.0  # loaded before the first request
    assert switch.thresholds("other", T).high_rate == 50.0
    client = lean(app)
    for _ in range(12):  # ~6/s, each a first-pop hit: above the file's 3/s
        await send_to(app, "broker-a", b"m")
        await client.receive(G, T, await_ms=500, broker="broker-a")
    assert switch.current(G, T) == "coupled"  # the default 50/s would have kept notify
    path.write_text("{broken")
    await wait_until(lambda: app.engine.status()["adaptive_thresholds"]["refused"] == 1)
    assert switch.thresholds(G, T).high_rate == 3.0  # refused: kept
    write(100.0, 60.0)
    await wait_until(lambda: switch.thresholds(G, T).high_rate == 100.0)
    path.unlink()
    await wait_until(lambda: switch.thresholds(G, T).high_rate == 50.0)
    task = app.engine.thresholds._task
    await app.stop()
    assert task is not None and task.cancelled()


async def test_receive_through_one_proxy_ack_through_another(backend, lean):
    """The receipt handle carries all an ack needs. Both messages are made visible again
    in one second through proxy 1; only one is acked, through proxy 2: the other comes back
    and the acked one does not."""
    first = await backend.start(mode="notify")
    second = await backend.start(mode="notify")
    group, topic = backend.group, backend.topic
    await backend.send_to("broker-b", b"stateless")
    await backend.send_to("broker-b", b"control")
    got = []
    for _ in range(10):
        got += (
            await lean(first).receive(group, topic, await_ms=1000, invisible_ms=10_000)
        ).messages
        if len(got) == 2:
            break
    by_body = {m.body: m for m in got}
    assert sorted(by_body) == [b"control", b"stateless"]
    for message in got:
        changed = await lean(first).change_invisible(group, topic, message, 1000)
        assert changed.status.code == OK
        message.system_properties.receipt_handle = changed.receipt_handle
    acked = await lean(second).ack(group, topic, [by_body[b"stateless"]])
    assert acked.status.code == OK and acked.entries[0].status.code == OK
    back: list[pb.Message] = []
    deadline = time.monotonic() + 8
    while not back and time.monotonic() < deadline:
        back = list((await lean(first).receive(group, topic, await_ms=1000)).messages)
    assert [m.body for m in back] == [b"control"]
    assert back[0].system_properties.delivery_attempt == 2
    again = await lean(first).receive(group, topic, await_ms=1000)
    assert again.status == NOT_FOUND  # the acked one stays gone
    if backend.stub:
        assert backend.cluster.broker("broker-b").pop.checkpoint_count == 1  # the control


async def test_a_cancelled_poll_loses_nothing(backend, lean):
    """Coupled mode parks the pop on the broker; the client leaves; a message then arrives
    into that parked pop. The proxy hands it back at once, so the next receive gets it in
    seconds, not after its 30 s invisible time. A real broker revives a handed-back message
    through its revive service: 2-4 s here, against well under a second for the stubs."""
    app = await backend.start(mode="coupled", hand_back_invisible_ms=500)
    group, topic = backend.group, backend.topic
    consumer = lean(app)
    poll = asyncio.ensure_future(consumer.receive(group, topic, await_ms=5000, broker="broker-a"))
    await parked(app, "coupled")
    poll.cancel()
    await asyncio.gather(poll, return_exceptions=True)
    await wait_until(lambda: not app.engine._polls, timeout=2)  # the cancellation arrived
    await backend.send_to("broker-a", b"precious")
    sent = time.perf_counter()
    found: list[pb.Message] = []
    while not found and time.perf_counter() - sent < 12:
        result = await lean(app).receive(group, topic, await_ms=1000, invisible_ms=30_000)
        found = list(result.messages)
    assert [m.body for m in found] == [b"precious"]
    assert time.perf_counter() - sent < HAND_BACK_BOUND_S[backend.kind]
    assert found[0].system_properties.delivery_attempt == 2  # handed back once
    assert app.consumer.handed_back == 1


async def test_a_broker_that_is_down_is_skipped(start_proxy, lean):
    app = await start_proxy(mode="notify")
    consumer = lean(app)
    await consumer.query_route(T)  # the proxy learns all three brokers
    await app.cluster.broker("broker-b").stop()
    started = time.perf_counter()
    poll = asyncio.ensure_future(consumer.receive(G, T, await_ms=3000, broker="broker-b"))
    # Past the dead broker's first pop: probing (the dead one's probe fails and retries).
    await wait_until(lambda: app.engine.hub.probes_in_flight >= 2, timeout=5)
    await send_to(app, "broker-c", b"around the hole")
    result = await poll
    assert [m.body for m in result.messages] == [b"around the hole"]
    assert time.perf_counter() - started < 1.5
    empty = await consumer.receive(G, T, await_ms=500, broker="broker-b")
    assert empty.status == NOT_FOUND  # answered on time, not stalled by the dead broker


async def test_finished_polls_leave_nothing_in_flight(backend, lean):
    app = await backend.start(mode="notify")
    consumer = lean(app)
    polls = [consumer.receive(backend.group, backend.topic, await_ms=400) for _ in range(5)]
    await asyncio.gather(*polls)
    status = app.engine.status()
    assert status["in_flight"] == {"notify": 0}
    assert status["probe_watchers"] == 0


async def test_coupled_poll_refused_by_a_full_broker_is_too_many_requests():
    """A broker that will not park another pop must not turn into an empty answer at once
    (the client would poll again at once): the client is told to back off."""
    async with StubCluster(1, template=BrokerConfig(topics=[T], polling_per_key=1)) as stub:
        pool = BrokerPool([stub.namesrv_address])
        config = ReceiveConfig(mode=ReceiveMode.COUPLED)
        consumer = ConsumerProcessor(pool, broker_timeout_s=3.0, hand_back_invisible_ms=1000)
        engine = ReceiveEngine(config, pool, consumer, ProxyMetrics())
        loop = asyncio.get_running_loop()

        def request() -> ReceiveRequest:
            now = loop.time()
            return ReceiveRequest(G, T, "*", 16, 30_000, 1000, now + 1.0, now)

        try:
            first = asyncio.ensure_future(engine.receive(request()))
            broker = stub.brokers[0]
            await wait_until(lambda: broker.pops.size == 1)  # parked: the key is now full
            with pytest.raises(TooManyRequests):
                await engine.receive(request())
            assert (await first).messages == []
        finally:
            await engine.close()
            await consumer.close()
            await pool.close()


# Tag filters, on the stubs: at most this many pops, and this many notifications, per
# delivered message. Measured with the miss pause: 1.3-3.6 pops, 1.0-2.9 notifications;
# without it 6.9-9.8 / 6.5-9.1. On RocketMQ 5.5.0 the two overlap: the old behaviour
# measured 3.5-8.0 / 3.2-7.5 depending on the machine's load, and today's code 1.6-3.0 /
# 2.0-4.2 from one run to the next, on an idle machine as in loaded CI runs (every probe
# answered hasMsg=true: each wake-up is a real arrival). So there the ratios are printed,
# not asserted.
FILTERED_POPS_PER_MESSAGE = 4.0
FILTERED_NOTIFICATIONS_PER_MESSAGE = 4.0


@pytest.mark.parametrize(
    ("expression", "filter_type"),
    [("tagA", pb.FilterType.TAG), ("TAGS = 'tagA'", pb.FilterType.SQL)],
    ids=["tag", "sql92"],
)
async def test_a_filter_that_drops_most_messages_does_not_storm_the_brokers(
    backend, lean, expression, filter_type
):
    """A notify poll for ``tagA`` while nine messages in ten are ``tagB``; the subscription a
    tag expression, or a SQL92 one that selects the same messages.

    A real broker's NOTIFICATION ignores the tag filter: every arriving message wakes the
    parked probe with hasMsg=true, and the pop that follows finds nothing for nine in ten.
    Probing again at once after each such empty pop cost a notification and a pop per
    *arriving* message: 7.9-8.0 pops and 7.3-7.5 notifications per delivered message on
    RocketMQ 5.5.0 at 40 and 100 messages/s (and without limit at higher rates, up to the
    poll's probe budget). The notify poll now pauses before probing a broker again after
    empty pops (``notify.MISS_BACKOFF_S``, up to 0.4 s, the count carried from poll to
    poll): measured 1.6-3.6 pops and 1.2-2.9 notifications per delivered message. The bound
    (``FILTERED_*``, on the stubs) leaves room for a loaded machine and fails the old
    behaviour; on real brokers every message must still arrive, once. A SQL92 subscription
    costs the same: a 5.5.0 broker's NOTIFICATION cannot evaluate SQL92 (it looks at the
    consume queue, where a SQL92 filter matches every message), so probes stay unfiltered.
    What remains per delivered message is the poll's first pop, the pop that finds it, and
    a pause or two of misses. The cost: a matching message waits up to one pause longer
    (median ~0.1-0.2 s, max ~0.55 s measured) while filtered traffic flows.
    """
    app = await backend.start(mode="notify")
    group, topic = backend.group, backend.topic
    consumer = lean(app)
    # The group's first poll before anything is sent: it starts at the end of the queues.
    await consumer.receive(
        group, topic, await_ms=300, expression=expression, filter_type=filter_type
    )
    base_pops = _pops(app)
    base_notes = _notifications(app)
    delivered: list = []
    stop = False

    async def consume() -> None:
        while not stop:
            result = await consumer.receive(
                group, topic, await_ms=2000, expression=expression, filter_type=filter_type
            )
            if result.messages:
                delivered.extend(result.messages)
                await consumer.ack(group, topic, result.messages)

    consuming = asyncio.ensure_future(consume())
    clients = {name: backend.broker_client(name) for name in ("broker-a", "broker-b")}
    sent, rate = 300, 200.0
    try:
        started = time.perf_counter()
        for i in range(sent):
            tag = "tagA" if i % 10 == 0 else "tagB"
            broker = ("broker-a", "broker-b")[(i + i // 10) % 2]  # tagA on both brokers
            await clients[broker].send(topic, f"m{i}".encode(), tag=tag)
            # Paced at ``rate`` messages a second: the load's arrival rate is the subject.
            await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.perf_counter()))
        await wait_until(lambda: len(delivered) >= sent // 10, timeout=10, step=0.05)
        pops, notes = _pops(app) - base_pops, _notifications(app) - base_notes
        stop = True
        await asyncio.wait_for(consuming, timeout=5)
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        for client in clients.values():
            await client.close()
    assert sorted(m.body for m in delivered) == sorted(f"m{i}".encode() for i in range(0, sent, 10))
    assert all(m.system_properties.tag == "tagA" for m in delivered)
    per_message = (pops / len(delivered), notes / len(delivered))
    print(f"{backend.kind}: pops/msg {per_message[0]:.2f}, notifications/msg {per_message[1]:.2f}")
    if backend.kind == "stub":  # see FILTERED_*: on real brokers they vary run to run
        assert per_message[0] <= FILTERED_POPS_PER_MESSAGE, per_message
        assert per_message[1] <= FILTERED_NOTIFICATIONS_PER_MESSAGE, per_message


def _pops(app) -> float:
    return value(
        app,
        "rocketmq_proxy_rpc_latency_seconds_count",
        protocol_type="remoting",
        request_code="pop_message",
    )


def _notifications(app) -> float:
    return value(app, "rocketmq_proxy_notifications_total")


@pytest.mark.parametrize("mode", ["notify", "coupled", "slicing"])
async def test_a_sql92_subscription_gets_only_what_it_matches_in_every_mode(backend, lean, mode):
    """The brokers apply a SQL92 subscription to every pop, parked or not; a message the
    filter leaves out is not delivered while a poll waits, one it keeps is."""
    app = await backend.start(mode=mode, slice_ms=100)
    group, topic = backend.group, backend.topic
    client = lean(app)
    sql = {"expression": "price > 10 AND region IN ('eu')", "filter_type": pb.FilterType.SQL}
    await client.receive(group, topic, await_ms=300, **sql)  # the group starts here
    for body, props in [(b"cheap", {"price": "5", "region": "eu"}),
                        (b"elsewhere", {"price": "50", "region": "us"}),
                        (b"none", {}),
                        (b"wanted", {"price": "50", "region": "eu"})]:  # fmt: skip
        await client.send(topic, body, properties=props)
    got: list = []
    deadline = time.monotonic() + 15
    while not got and time.monotonic() < deadline:
        got += (await client.receive(group, topic, await_ms=2000, **sql)).messages
    assert [m.body for m in got] == [b"wanted"]
    assert (await client.receive(group, topic, await_ms=500, **sql)).messages == []
    bad = await client.receive(
        group, topic, await_ms=500, expression="price >", filter_type=pb.FilterType.SQL
    )
    assert (bad.status, bad.message) == (
        pb.Code.INTERNAL_SERVER_ERROR,
        "parse the consumer's subscription failed",
    )
