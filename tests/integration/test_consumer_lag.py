"""``rocketmq_proxy_consumer_lag_messages``: the messages of a topic a group with a consumer
on this proxy has not consumed, from the brokers' consume stats, and
``rocketmq_proxy_consumer_lag_oldest_seconds``, the oldest one's age, on broker stubs. (On real
5.5.0 brokers, against ``mqadmin consumerProgress``: tests/interop/test_rocketmq_tools.py.)"""

from __future__ import annotations

import asyncio
import time

from proxy.api.v2 import definition_pb2 as pb
from testkit.lean_client import LeanClient, SettingsClient, TelemetryStream, consumer_settings
from testkit.metrics_text import samples
from testkit.waits import wait_until


def lag(app, group: str, topic: str, name: str = "messages") -> float | None:
    body, _ = app.metrics.render()
    found = [
        value
        for labels, value in samples(body, f"rocketmq_proxy_consumer_lag_{name}")
        if labels == {"group": group, "topic": topic}
    ]
    return found[0] if found else None


async def test_the_lag_follows_a_backlog_and_its_consumption(start_proxy):
    app = await start_proxy(mode="notify", brokers=2, topics=("T",))
    assert app.lag is not None and app.registrations is not None
    endpoint = f"127.0.0.1:{app.grpc_port}"
    producer = SettingsClient(endpoint, "lag-producer")
    consumer = SettingsClient(endpoint, "lag-consumer")
    try:
        await consumer.prepare("G", "T", 200)  # registered: its pair is refreshed
        await wait_until(lambda: ("G", "T") in app.registrations.consumed(), timeout=5)
        first_sent = time.time()
        for i in range(7):
            sent = await producer.send("T", f"m{i}".encode())
            assert sent.status.code == pb.Code.OK, sent.status
        await asyncio.sleep(0.3)  # the oldest message ages: what the second gauge reads
        await app.lag.refresh_once()
        refreshed = time.time()
        assert lag(app, "G", "T") == 7
        oldest = lag(app, "G", "T", "oldest_seconds")
        assert oldest is not None and 0.3 <= oldest <= refreshed - first_sent + 0.01
        got = 0
        for _ in range(20):
            if got == 7:
                break
            answer = await consumer.receive("G", "T", await_ms=200, batch=32)
            got += len(answer.messages)
            if answer.messages:
                await consumer.ack("G", "T", answer.messages)
        assert got == 7
        await app.lag.refresh_once()
        assert lag(app, "G", "T") == 0
        assert lag(app, "G", "T", "oldest_seconds") == 0
        await consumer.close()  # its last stream ends: the pair leaves /metrics
        await wait_until(lambda: not app.registrations.consumed(), timeout=5)
        await app.lag.refresh_once()
        assert lag(app, "G", "T") is None
        assert lag(app, "G", "T", "oldest_seconds") is None
    finally:
        await producer.close()
        await consumer.close()


async def test_a_later_subscription_on_the_open_stream_reaches_the_registration_and_the_lag(
    start_proxy,
):
    """An official consumer writes its settings again on its open stream when it subscribes
    anew: the proxy registers the new subscription in place of the old one, and its pair's
    lag is published; a pair it dropped leaves."""
    app = await start_proxy(mode="notify", brokers=2, topics=("T", "U"))
    assert app.lag is not None and app.registrations is not None
    endpoint = f"127.0.0.1:{app.grpc_port}"
    producer = LeanClient(endpoint, "later-producer")
    consumer = LeanClient(endpoint, None)
    stream = TelemetryStream(consumer, "later-consumer")
    try:
        first = await stream.settle(consumer_settings(pb.ClientType.PUSH_CONSUMER, "G", "T", 200))
        assert first.status.code == pb.Code.OK and first.HasField("settings")
        await wait_until(lambda: app.registrations.consumed() == {("G", "T")}, timeout=5)
        both = consumer_settings(pb.ClientType.PUSH_CONSUMER, "G", "T", 200)
        both.subscription.subscriptions.add().topic.name = "U"
        assert (await stream.settle(both)).status.code == pb.Code.OK
        await wait_until(
            lambda: app.registrations.consumed() == {("G", "T"), ("G", "U")}, timeout=5
        )
        for i in range(3):
            assert (await producer.send("U", f"u{i}".encode())).status.code == pb.Code.OK
        await app.lag.refresh_once()
        assert lag(app, "G", "U") == 3 and lag(app, "G", "T") == 0
        only_u = consumer_settings(pb.ClientType.PUSH_CONSUMER, "G", "U", 200)
        assert (await stream.settle(only_u)).status.code == pb.Code.OK
        await wait_until(lambda: app.registrations.consumed() == {("G", "U")}, timeout=5)
        await app.lag.refresh_once()
        assert lag(app, "G", "T") is None and lag(app, "G", "U") == 3
        assert app.registrations.status()["clients"] == 1
    finally:
        stream.close()
        await producer.close()
        await consumer.close()
