"""Lite topics (RocketMQ 5.5) through the proxy: SyncLiteSubscription, the settings a lite
consumer needs, lite sends, lite polls and lite acks, on both backends.

The real backend is RocketMQ 5.5.0 (brokers with enableLmq and enableMultiDispatch); the stub
backend serves lite once ``broker_stub`` implements it. Bad input is refused by the proxy
before any broker is asked, so those tests hold on either backend.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.config import PollMode
from proxy.remoting.lite import lite_queue_index
from rocketmq_local import admin
from testkit.lean_client import consumer_settings, millis
from testkit.waits import wait_until

Code = pb.Code


async def lite_names(backend, app, quota: int | None = None) -> tuple[str, str]:
    """A fresh LITE parent topic on both brokers and a lite group bound to it."""
    namesrv = app.config.namesrv_addrs[0]
    parent, group = backend.new_names()
    parent, group = f"L{parent}", f"L{group}"
    await asyncio.to_thread(admin.create_topic, namesrv, parent, 4, message_type="LITE")
    await asyncio.to_thread(
        admin.create_group, namesrv, group, lite_parent=parent, lite_quota=quota
    )
    return parent, group


async def receive_until(client, group: str, parent: str, count: int, await_ms: int = 2000):
    """Receive (and not ack) until ``count`` messages are in hand; bounded."""
    got: list[pb.Message] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        result = await client.receive(group, parent, await_ms=await_ms, batch=32)
        got.extend(result.messages)
    return got


async def settings_of(app, client_id: str, group: str, parent: str) -> pb.Settings:
    """The settings the proxy answers a LiteSimpleConsumer's Telemetry settings with."""
    import grpc

    from proxy.api.v2 import service_pb2_grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    try:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        settings = consumer_settings(pb.ClientType.LITE_SIMPLE_CONSUMER, group, parent, 5000)
        call = stub.Telemetry(metadata=(("x-mq-client-id", client_id),), timeout=10)
        await call.write(api.TelemetryCommand(settings=settings))
        answer = await call.read()
        await call.done_writing()
        call.cancel()
        assert answer.status.code == Code.OK, answer.status
        return answer.settings
    finally:
        await channel.close(None)


async def test_settings_carry_the_group_quota_and_the_longest_name(backend):
    app = await backend.start()
    parent, group = await lite_names(backend, app, quota=7)

    settings = await settings_of(app, "lite-settings", group, parent)

    assert settings.subscription.lite_subscription_quota == 7
    assert settings.subscription.max_lite_topic_size == 64


async def test_a_lite_consumer_gets_its_lite_topics_only_and_acks_them(backend, lean):
    app = await backend.start()
    parent, group = await lite_names(backend, app)
    client = lean(app, "lite-client-1")
    synced = await client.sync_lite(group, parent, ["alpha", "beta"])
    assert synced.status.code == Code.OK, synced.status
    for lite in ("alpha", "beta", "gamma", "alpha"):
        sent = await client.send(parent, f"{lite}-body".encode(), lite_topic=lite)
        assert sent.status.code == Code.OK, sent.status

    got = await receive_until(client, group, parent, 3)

    assert sorted(m.body for m in got) == [b"alpha-body", b"alpha-body", b"beta-body"]
    assert {m.system_properties.lite_topic for m in got} == {"alpha", "beta"}
    assert {m.system_properties.message_type for m in got} == {pb.MessageType.LITE}
    acked = await client.ack(group, parent, got)
    assert [e.status.code for e in acked.entries] == [Code.OK] * 3
    # Nothing more: gamma was never subscribed, and the acked ones do not come back.
    again = await client.receive(group, parent, await_ms=1000)
    assert again.status == Code.MESSAGE_NOT_FOUND and not again.messages


async def test_a_lite_message_goes_to_the_broker_that_owns_its_lite_topic(backend, lean):
    app = await backend.start()
    parent, _ = await lite_names(backend, app)
    client = lean(app, "lite-producer")
    names = [f"owner-{i}" for i in range(6)]
    for name in names:
        sent = await client.send(parent, b"x", lite_topic=name)
        assert sent.status.code == Code.OK, sent.status

    for name in names:
        owner = ("broker-a", "broker-b")[lite_queue_index(name, 8) // 4]
        other = "broker-b" if owner == "broker-a" else "broker-a"
        lmq = f"%LMQ%${parent}${name}"
        assert await backend.max_offset(owner, lmq) == 1, name
        assert await backend.max_offset(other, lmq) == 0, name


async def _parked(app, polls: int) -> None:
    """Until ``polls`` lite polls are in flight, and a little longer: parked on the brokers."""
    await wait_until(
        lambda: app.engine.in_flight[PollMode.LITE] == polls,
        timeout=5,
        step=0.02,
        what=lambda: f"{polls} lite poll(s) in flight (in flight: {app.engine.in_flight})",
    )
    # The count rises before the pops reach the brokers, and the brokers show no count of
    # the lite pops they hold (conformance/test_lite.py): give them time to park.
    await asyncio.sleep(0.5)


async def test_a_parked_lite_poll_answers_when_a_message_arrives(backend, lean):
    app = await backend.start()
    parent, group = await lite_names(backend, app)
    client = lean(app, "lite-client-2")
    assert (await client.sync_lite(group, parent, ["late"])).status.code == Code.OK
    producer = lean(app, "lite-producer-2")

    async def send_later() -> None:
        # Once the poll is parked: it counts as a long poll in flight, mode lite.
        await _parked(app, 1)
        await producer.send(parent, b"late-body", lite_topic="late")

    started = time.monotonic()
    sender = asyncio.create_task(send_later())
    result = await client.receive(group, parent, await_ms=10_000)
    waited = time.monotonic() - started
    await sender

    assert [m.body for m in result.messages] == [b"late-body"]
    assert waited < 8, f"answered after {waited:.1f}s, not when the message arrived"
    assert (await client.ack(group, parent, result.messages)).status.code == Code.OK


async def test_a_pop_left_parked_by_the_last_poll_serves_the_next_poll(backend, lean):
    """A LiteSimpleConsumer's poll parks a pop on every broker; the poll answered from one
    broker leaves the other's parked until its time is up, and a broker wakes its oldest
    parked pop of a client first. The next message there wakes that stale pop, not the
    client's live poll: it must still reach the live poll, at once and at its first
    attempt, not be handed back to come again seconds later."""
    app = await backend.start()
    parent, group = await lite_names(backend, app)
    on_a = next(f"a{i}" for i in range(100) if lite_queue_index(f"a{i}", 8) < 4)
    on_b = next(f"b{i}" for i in range(100) if lite_queue_index(f"b{i}", 8) >= 4)
    client = lean(app, "lite-stale")
    assert (await client.sync_lite(group, parent, [on_a, on_b])).status.code == Code.OK
    producer = lean(app, "lite-stale-producer")

    first = asyncio.create_task(client.receive(group, parent, await_ms=15_000))
    await _parked(app, 1)
    assert (await producer.send(parent, b"on-a", lite_topic=on_a)).status.code == Code.OK
    answered = await asyncio.wait_for(first, 10)
    assert [m.body for m in answered.messages] == [b"on-a"]
    assert (await client.ack(group, parent, answered.messages)).status.code == Code.OK

    second = asyncio.create_task(client.receive(group, parent, await_ms=15_000))
    await _parked(app, 1)
    started = time.monotonic()
    assert (await producer.send(parent, b"on-b", lite_topic=on_b)).status.code == Code.OK
    result = await asyncio.wait_for(second, 20)
    waited = time.monotonic() - started

    assert [m.body for m in result.messages] == [b"on-b"]
    assert result.messages[0].system_properties.delivery_attempt == 1
    assert waited < 5, f"answered {waited:.1f}s after the send"
    assert (await client.ack(group, parent, result.messages)).status.code == Code.OK


@pytest.mark.slow
async def test_lite_polls_count_against_the_in_flight_limit(backend, lean):
    """A lite poll holds a parked pop on every broker: it is a long poll like any other,
    within ``receive.max_in_flight``."""
    app = await backend.start(max_in_flight=1)
    parent, group = await lite_names(backend, app)
    first, second = lean(app, "lite-client-limit-1"), lean(app, "lite-client-limit-2")
    for client in (first, second):
        assert (await client.sync_lite(group, parent, ["idle"])).status.code == Code.OK
    held = asyncio.create_task(first.receive(group, parent, await_ms=5000))
    await wait_until(
        lambda: app.engine.in_flight[PollMode.LITE] == 1,
        timeout=5,
        step=0.02,
        what=lambda: f"a lite poll (in flight: {app.engine.in_flight})",
    )
    refused = await second.receive(group, parent, await_ms=5000)
    assert refused.status == Code.TOO_MANY_REQUESTS, refused.message
    assert not (await held).messages


async def test_an_unsubscribed_lite_topic_is_no_longer_delivered(backend, lean):
    app = await backend.start()
    parent, group = await lite_names(backend, app)
    client = lean(app, "lite-client-3")
    assert (await client.sync_lite(group, parent, ["keep", "drop"])).status.code == Code.OK
    removed = await client.sync_lite(
        group, parent, ["drop"], action=pb.LiteSubscriptionAction.PARTIAL_REMOVE
    )
    assert removed.status.code == Code.OK
    await client.send(parent, b"drop-body", lite_topic="drop")
    await client.send(parent, b"keep-body", lite_topic="keep")

    got = await receive_until(client, group, parent, 1)
    assert [m.body for m in got] == [b"keep-body"]
    await client.ack(group, parent, got)
    again = await client.receive(group, parent, await_ms=1000)
    assert not again.messages


@pytest.mark.slow
async def test_offset_option_min_replays_what_the_group_already_acked(backend, lean):
    app = await backend.start()
    parent, group = await lite_names(backend, app)
    first = lean(app, "lite-client-4")
    assert (await first.sync_lite(group, parent, ["replay"])).status.code == Code.OK
    await first.send(parent, b"replay-body", lite_topic="replay")
    got = await receive_until(first, group, parent, 1)
    assert (await first.ack(group, parent, got)).status.code == Code.OK
    second = lean(app, "lite-client-5")

    synced = await second.sync_lite(
        group, parent, ["replay"], offset_option=pb.OffsetOption(policy=pb.OffsetOption.MIN)
    )

    assert synced.status.code == Code.OK
    replayed = await receive_until(second, group, parent, 1)
    assert [m.body for m in replayed] == [b"replay-body"]


@pytest.mark.parametrize(
    ("names", "code"),
    [
        (["a b"], Code.ILLEGAL_LITE_TOPIC),
        ([" "], Code.ILLEGAL_LITE_TOPIC),
        (["x" * 65], Code.ILLEGAL_LITE_TOPIC),
        (["ok", "é"], Code.ILLEGAL_LITE_TOPIC),
    ],
)
async def test_bad_lite_topic_names_are_refused(backend, lean, names, code):
    app = await backend.start()
    client = lean(app, "lite-bad")

    answer = await client.sync_lite(backend.group, backend.topic, names)

    assert answer.status.code == code


async def test_bad_sync_requests_get_the_codes_clients_expect(backend, lean):
    app = await backend.start()
    client = lean(app, "lite-bad-2")
    no_group = await client.sync_lite("", backend.topic, ["a"])
    assert no_group.status.code == Code.ILLEGAL_CONSUMER_GROUP
    no_topic = await client.sync_lite(backend.group, "", ["a"])
    assert no_topic.status.code == Code.ILLEGAL_TOPIC
    unknown = await client.sync_lite(backend.group, "NoSuchLiteParent", ["a"])
    assert unknown.status.code == Code.TOPIC_NOT_FOUND
    empty_option = await client.sync_lite(
        backend.group, backend.topic, ["a"], offset_option=pb.OffsetOption()
    )
    assert empty_option.status.code == Code.ILLEGAL_OFFSET
    anonymous = lean(app, None)
    assert (await anonymous.sync_lite(backend.group, backend.topic, ["a"])).status.code == (
        Code.CLIENT_ID_REQUIRED
    )


async def test_a_bad_lite_topic_on_send_is_refused(backend, lean):
    app = await backend.start()
    client = lean(app, "lite-bad-send")

    sent = await client.send(backend.topic, b"x", lite_topic="not ok")

    assert sent.status.code == Code.ILLEGAL_LITE_TOPIC


async def test_a_lite_topic_taken_by_another_client_is_told_on_telemetry(backend, lean):
    """An exclusive lite group (lite.sub.model=Exclusive): a second client's subscription of
    a lite topic takes it from the first; the broker says so to the proxy
    (NOTIFY_UNSUBSCRIBE_LITE), and the proxy to the first client's Telemetry stream."""
    import grpc

    from proxy.api.v2 import service_pb2_grpc

    app = await backend.start()
    namesrv = app.config.namesrv_addrs[0]
    parent, group = backend.new_names()
    parent, group = f"L{parent}", f"X{group}"
    await asyncio.to_thread(admin.create_topic, namesrv, parent, 4, message_type="LITE")
    await asyncio.to_thread(
        admin.create_group,
        namesrv,
        group,
        lite_parent=parent,
        attributes={"lite.sub.model": "Exclusive"},
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    call = stub.Telemetry(metadata=(("x-mq-client-id", "lite-first"),), timeout=30)
    try:
        settings = pb.Settings(
            client_type=pb.ClientType.LITE_PUSH_CONSUMER,
            request_timeout=millis(3000),
            subscription=pb.Subscription(
                group=pb.Resource(name=group),
                subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=parent))],
            ),
        )
        await call.write(api.TelemetryCommand(settings=settings))
        assert (await asyncio.wait_for(call.read(), 10)).status.code == Code.OK
        first, second = lean(app, "lite-first"), lean(app, "lite-second")
        assert (await first.sync_lite(group, parent, ["solo"])).status.code == Code.OK
        assert (await second.sync_lite(group, parent, ["solo"])).status.code == Code.OK

        told = await asyncio.wait_for(call.read(), 10)

        assert told.WhichOneof("command") == "notify_unsubscribe_lite_command", told
        assert told.notify_unsubscribe_lite_command.lite_topic == "solo"
    finally:
        call.cancel()
        await channel.close(None)
