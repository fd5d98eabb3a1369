"""The one reading of a 4.x request's body that the remoting port's guard and relay share
(``proxy/remoting/bodies.py``): every key a broker reads a name from, the last written
winning, and a refusal where the broker would coerce a value into a name. The same
readings against a real broker's classes: tests/interop/test_remoting_bodies.py."""

from __future__ import annotations

import orjson
import pytest

from proxy.remoting import fastjson
from proxy.remoting.bodies import (
    Acked,
    BatchAcks,
    Consumer,
    Heartbeat,
    Queue,
    QueueLock,
    UnreadableBody,
    read_body,
    reading,
)
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand


def batch_ack(text: str | bytes) -> RemotingCommand:
    body = text.encode() if isinstance(text, str) else text
    return RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, {}, body)


def test_a_field_is_read_from_the_last_of_its_names_written():
    assert (
        fastjson.field(fastjson.loads('{"c":"a","consumerGroup":"b"}'), "c", "consumerGroup") == "b"
    )
    assert (
        fastjson.field(fastjson.loads('{"consumerGroup":"b","c":"a"}'), "c", "consumerGroup") == "a"
    )
    # A key written twice counts where it was written last.
    text = '{"c":"a","consumerGroup":"b","c":"d"}'
    assert fastjson.field(fastjson.loads(text), "c", "consumerGroup") == "d"
    assert fastjson.field({}, "c") is None


@pytest.mark.parametrize(
    ("entry", "group", "topic"),
    [
        ({"c": "G", "t": "T"}, "G", "T"),
        ({"consumerGroup": "G", "topic": "T"}, "G", "T"),
        ({"consumerGroup": "allowed", "c": "victim", "t": "T"}, "victim", "T"),
        ({"c": "victim", "consumerGroup": "allowed", "topic": "U", "t": "T"}, "allowed", "T"),
    ],
)
def test_a_batch_acks_group_and_topic_are_those_the_broker_reads(entry, group, topic):
    body = read_body(batch_ack(orjson.dumps({"acks": [entry]})))
    assert body == BatchAcks((Acked(group, topic),))


@pytest.mark.parametrize(
    "text",
    [
        '{"acks":[{"t":"T"}]}',  # no group
        '{"acks":[{"c":"","t":"T"}]}',  # an empty one
        '{"acks":[{"c":["victim"],"t":"T"}]}',  # the broker reads a one-item array as "victim"
        '{"acks":[{"c":5,"t":"T"}]}',  # and a number as "5"
        '{"acks":{"c":"victim","t":"T"}}',  # and an object as a list of one
        '{"acks":[1]}',
        "[]",
        "{not json",
    ],
)
def test_a_body_the_broker_would_coerce_into_names_cannot_be_read(text):
    with pytest.raises(UnreadableBody):
        read_body(batch_ack(text))
    assert isinstance(reading(batch_ack(text)), UnreadableBody)


def test_locks_and_heartbeats_name_their_groups_and_topics():
    lock = {"consumerGroup": "G", "mqSet": [{"topic": "T", "brokerName": "b", "queueId": 0}]}
    cmd = RemotingCommand(RequestCode.LOCK_BATCH_MQ, {}, orjson.dumps(lock))
    assert read_body(cmd) == QueueLock("G", (Queue("T", "b"),))
    heartbeat = (
        '{"clientID":"c","producerDataSet":[{"groupName":"P"}],"consumerDataSet":'
        '[{"groupName":"allowed","groupName":"G","subscriptionDataSet":[{"topic":"T"}]}]}'
    )
    cmd = RemotingCommand(RequestCode.HEART_BEAT, {}, heartbeat.encode())
    assert read_body(cmd) == Heartbeat(("P",), (Consumer("G", ("T",)),))
    # A request whose body names nothing is not read at all.
    assert reading(RemotingCommand(RequestCode.SEND_MESSAGE_V2, {}, b"{not json")) is None
