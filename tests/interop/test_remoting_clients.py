"""The official Java client's remoting API (rocketmq-client 5.5.0, the API of the 4.x
clients) through the proxy's remoting port, on real RocketMQ 5.5.0 brokers; and the same
through the Apache proxy's remoting port, the peer.

Every client is built as an application builds it: its name server address is the proxy's
remoting port, and nothing else is set but the group and, for consumers, where a new group
starts (the first offset, so that what was sent before the consumer started counts too).
"""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest

from rocketmq_local import admin
from testkit.official import remoting_java
from testkit.official.harness import ProxyProcess, start_proxy

pytestmark = [pytest.mark.real, pytest.mark.interop]

VIAS = ("ours", "apache")
RESULT_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def remoting_proxy(real_cluster, tmp_path_factory):
    """Our proxy in front of the session's real cluster, its remoting port on, run as a user
    runs it (``rmq-proxy --namesrv ... --remoting-port``, default workers)."""
    proxy = start_proxy(
        tmp_path_factory.mktemp("remoting-proxy"),
        (),
        namesrv=real_cluster.namesrv_address,
        extra_args=("--remoting-port", "0"),
    )
    try:
        yield proxy
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


@pytest.fixture(params=VIAS)
def via(request, real_cluster) -> str:
    """The remoting address the clients use: ours, or the Apache proxy's (the peer)."""
    if request.param == "ours":
        proxy: ProxyProcess = request.getfixturevalue("remoting_proxy")
        assert proxy.remoting, f"no remoting port in the ready line\n{proxy.logs()}"
        return proxy.remoting
    apache = request.getfixturevalue("apache_proxy")
    return f"127.0.0.1:{apache.remoting_port}"


@pytest.fixture
def homes(tmp_path):
    names = iter(range(1, 100))
    return lambda role: tmp_path / f"{next(names)}-{role}"


def fresh(real_cluster, prefix: str, message_type: str | None = None) -> tuple[str, str, str]:
    """A new topic on both brokers (of ``message_type``: its message.type attribute), and
    new producer and consumer group names."""
    tag = uuid.uuid4().hex[:8]
    topic = f"{prefix}-{tag}"
    admin.create_topic(real_cluster.namesrv_address, topic, message_type=message_type)
    return topic, f"{prefix}-p-{tag}", f"{prefix}-c-{tag}"


def bodies(result: dict) -> list[str]:
    return [m["body"] for m in result["messages"]]


def test_a_push_consumer_gets_every_message_a_producer_sends(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-push")
    push = remoting_java.start(
        homes("push"),
        "push",
        "--namesrv",
        via,
        "--group",
        consumer,
        "--topic",
        topic,
        "--expect",
        40,
    )
    sent = remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        via,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        40,
    )
    got = push.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and got["errors"] == []
    assert {m["status"] for m in sent["sent"]} == {"SEND_OK"}
    # Spread over both brokers, and every one consumed.
    assert {m["broker"] for m in sent["sent"]} == {"broker-a", "broker-b"}
    assert set(bodies(got)) == {f"m-{i}" for i in range(40)}


def test_a_lite_pull_consumer_gets_every_message(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-lite")
    sent = remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        via,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        20,
    )
    got = remoting_java.run(
        homes("litepull"),
        "litepull",
        "--namesrv",
        via,
        "--group",
        consumer,
        "--topic",
        topic,
        "--expect",
        20,
        timeout_s=RESULT_TIMEOUT_S,
    )
    assert sent["errors"] == [] and got["errors"] == []
    assert set(bodies(got)) == {f"m-{i}" for i in range(20)}


def test_an_orderly_consumer_gets_each_key_in_the_order_sent(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-order")
    push = remoting_java.start(
        homes("push"),
        "push",
        "--namesrv",
        via,
        "--group",
        consumer,
        "--topic",
        topic,
        "--expect",
        48,
        "--orderly",
    )
    sent = remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        via,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        48,
        "--kind",
        "orderly",
        "--order-keys",
        4,
    )
    got = push.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and got["errors"] == []
    assert set(bodies(got)) == {f"m-{i}" for i in range(48)}
    by_key: dict[str, list[int]] = defaultdict(list)
    for message in got["messages"]:
        index = int(message["body"].split("-")[1])
        if index not in by_key[message["key"]]:  # a redelivery repeats, in order
            by_key[message["key"]].append(index)
    assert sorted(by_key) == ["k0", "k1", "k2", "k3"]
    for key, indices in by_key.items():
        assert indices == sorted(indices), f"{key} out of order: {indices}"


def test_broadcasting_consumers_each_get_every_message(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-bcast")
    consumers = [
        remoting_java.start(
            homes(f"push-{n}"),
            "push",
            "--namesrv",
            via,
            "--group",
            consumer,
            "--topic",
            topic,
            "--expect",
            16,
            "--broadcast",
        )
        for n in range(2)
    ]
    remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        via,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        16,
    )
    for push in consumers:
        got = push.result(RESULT_TIMEOUT_S)
        assert got["errors"] == []
        assert set(bodies(got)) == {f"m-{i}" for i in range(16)}


def test_a_delayed_message_is_consumed_after_its_delay(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-delay", "DELAY")
    push = remoting_java.start(
        homes("push"),
        "push",
        "--namesrv",
        via,
        "--group",
        consumer,
        "--topic",
        topic,
        "--expect",
        1,
    )
    sent = remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        via,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        1,
        "--kind",
        "delay",
        "--delay-level",
        2,
    )
    got = push.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and got["errors"] == []
    [message] = got["messages"]
    # Delay level 2 is 5 s; the broker's timer ticks each second.
    assert message["at_ms"] - message["born_ms"] >= 4_000


def run_transactions(
    real_cluster, address: str, homes, consume_s: int, checks: int = 3
) -> tuple[dict, list]:
    """Nine transactional messages (committed, rolled back, left open by turns, the
    checker committing what it is asked about), and what a push consumer got meanwhile."""
    topic, producer, consumer = fresh(real_cluster, "rm-tx", "TRANSACTION")
    push = remoting_java.start(
        homes("push"),
        "push",
        "--namesrv",
        address,
        "--group",
        consumer,
        "--topic",
        topic,
        "--expect",
        9,
        "--seconds",
        consume_s,
    )
    sent = remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        address,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        9,
        "--kind",
        "transaction",
        timeout_s=RESULT_TIMEOUT_S,
    )
    got = push.result(consume_s + RESULT_TIMEOUT_S)
    assert sent["errors"] == []
    assert set(sent["committed"]) == {f"m-{i}" for i in range(0, 9, 3)}
    return sent, bodies(got)


def test_transactions_deliver_what_was_committed_or_checked(real_cluster, remoting_proxy, homes):
    sent, got = run_transactions(real_cluster, remoting_proxy.remoting, homes, consume_s=15)
    committed = {f"m-{i}" for i in range(0, 9, 3)}
    rolled_back = {f"m-{i}" for i in range(1, 9, 3)}
    open_ = {f"m-{i}" for i in range(2, 9, 3)}
    # Each transaction left open was checked with the producer (on its own connection),
    # which committed it; the producer's own commits and rollbacks reached the brokers.
    assert set(sent["checked"]) == open_
    assert set(got) == committed | open_
    assert not set(got) & rolled_back


def test_the_apache_proxy_drops_a_producers_own_end_of_transaction(
    real_cluster, apache_proxy, homes
):
    """The peer's difference (docs/api.md): it answers END_TRANSACTION itself and sends it
    on only for a transaction it has a record of, which it keeps for its gRPC clients
    alone. A remoting producer's commit or rollback is lost, so the broker checks every
    transaction, and a rolled-back one is delivered when the checker commits it."""
    address = f"127.0.0.1:{apache_proxy.remoting_port}"
    sent, got = run_transactions(real_cluster, address, homes, consume_s=120, checks=9)
    assert set(sent["checked"]) == {f"m-{i}" for i in range(9)}
    assert {f"m-{i}" for i in range(1, 9, 3)} <= set(got)  # the rolled-back ones


def test_a_message_its_topic_does_not_take_is_refused(real_cluster, via, homes):
    topic, producer, _ = fresh(real_cluster, "rm-typed", "NORMAL")
    sent = remoting_java.run(
        homes("produce"),
        "produce",
        "--namesrv",
        via,
        "--group",
        producer,
        "--topic",
        topic,
        "--count",
        1,
        "--kind",
        "delay",
    )
    [error] = sent["errors"]
    assert "CODE: 13" in error and "TopicMessageType validate failed" in error
