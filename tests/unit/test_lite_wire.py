"""Lite topics on the wire: headers, the LITE_SUBSCRIPTION_CTL body, lite-topic sharding and
the reconsume counts of a lite pop. Expected values come from the 5.5.0 jars (Guava's
consistentHash and Java's String.hashCode, checked with the JDK)."""

from __future__ import annotations

import orjson
import pytest

from proxy.remoting.answers import lite_order_counts
from proxy.remoting.headers import (
    AckMessageHeader,
    ChangeInvisibleTimeHeader,
    HeaderError,
    NotifyUnsubscribeLiteHeader,
    PopLiteMessageHeader,
)
from proxy.remoting.lite import (
    LiteAction,
    LiteSubscription,
    LiteSubscriptionCtlBody,
    OffsetOption,
    OffsetType,
    consistent_hash,
    java_string_hash,
    lite_queue_index,
    lmq_name,
    split_lmq_name,
)


def test_pop_lite_header_names_max_msg_num_singular():
    fields = PopLiteMessageHeader("c", "g", "t", 4, 30_000, poll_time=0, born_time=1).encode()
    assert fields["maxMsgNum"] == "4" and "maxMsgNums" not in fields
    assert "attemptId" not in fields
    with pytest.raises(HeaderError, match="clientId"):
        PopLiteMessageHeader.decode({k: v for k, v in fields.items() if k != "clientId"})


def test_ack_and_change_carry_lite_topic_only_when_given():
    assert "liteTopic" not in AckMessageHeader("g", "t", 0, "x", 1).encode()
    change = ChangeInvisibleTimeHeader("g", "t", 0, "x", 5, invisible_time=100, lite_topic="a")
    fields = change.encode()
    assert fields["liteTopic"] == "a" and fields["invisibleTime"] == "100"
    assert "suspend" not in fields
    assert ChangeInvisibleTimeHeader.decode(fields) == change


def test_notify_unsubscribe_requires_every_field():
    fields = NotifyUnsubscribeLiteHeader("lt", "g", "c").encode()
    assert fields == {"liteTopic": "lt", "consumerGroup": "g", "clientId": "c"}
    with pytest.raises(HeaderError, match="liteTopic"):
        NotifyUnsubscribeLiteHeader.decode({"consumerGroup": "g", "clientId": "c"})


def test_ctl_body_round_trip_and_json_names():
    entry = LiteSubscription(
        LiteAction.PARTIAL_ADD,
        "cid",
        "g",
        "parent",
        ("a", "b"),
        OffsetOption(OffsetType.POLICY, 1),
        3,
    )
    body = LiteSubscriptionCtlBody((entry,)).encode()
    assert orjson.loads(body) == {
        "subscriptionSet": [
            {
                "action": "PARTIAL_ADD",
                "clientId": "cid",
                "group": "g",
                "topic": "parent",
                "liteTopicSet": ["a", "b"],
                "offsetOption": {"type": "POLICY", "value": 1},
                "version": 3,
            }
        ]
    }
    assert LiteSubscriptionCtlBody.decode(body).subscriptions == (entry,)
    without = LiteSubscription(LiteAction.COMPLETE_REMOVE, "cid", "g", "parent")
    assert "offsetOption" not in without.to_json()


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"subscriptionSet": [{"action": "NOPE"}]}',
     b'{"subscriptionSet": [{"action": "PARTIAL_ADD", "liteTopicSet": [1]}]}',
     b'{"subscriptionSet": [{"action": "PARTIAL_ADD", "offsetOption": {"type": "X"}}]}'],
)  # fmt: skip
def test_ctl_body_rejects_bad_input(body):
    with pytest.raises(ValueError):
        LiteSubscriptionCtlBody.decode(body)


def test_lmq_names():
    assert lmq_name("P", "a") == "%LMQ%$P$a"
    assert split_lmq_name("%LMQ%$P$a") == ("P", "a")
    assert split_lmq_name("%LMQ%P") is None
    assert split_lmq_name("P") is None


def test_java_hashing_matches_the_jdk_and_guava():
    # Values printed by the JDK with guava-32.0.1 (the jar the 5.5.0 broker ships).
    assert java_string_hash("t1") == 3645
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("日本") == 835047
    assert [consistent_hash(i, 8) for i in range(10)] == [0, 6, 6, 3, 1, 4, 5, 0, 4, 7]
    assert consistent_hash(-5, 100) == 83
    assert consistent_hash(-123456789, 1000) == 502
    assert lite_queue_index("lite-topic-abc_123", 37) == 9
    assert lite_queue_index("t1", 8) == 4


def test_lite_order_counts():
    assert lite_order_counts(None, 2) == [0, 0]
    assert lite_order_counts("0;2", 2) == [0, 2]
    assert lite_order_counts("0 qo0%0 1", 1) == [1]
    assert lite_order_counts("1;2", 3) == [0, 0, 0]  # another length: ignored
    assert lite_order_counts("x", 1) == [0]
