"""A popped message as the gRPC API's Message: every field the clients read."""

from __future__ import annotations

import hashlib
import zlib

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from proxy.api.convert import duration, timestamp, to_api_message
from proxy.api.v2 import definition_pb2 as pb
from proxy.receive.types import PolledMessage
from proxy.remoting.message import SYSFLAG_COMPRESSED, MessageExt

POP_CK = "4 1700000000000 30000 2 0 broker-a 1 5"


@pytest.mark.parametrize("ms", [0, 1, 999, 1000, 1_700_000_000_123, -1, -999, -1001])
def test_timestamps_and_durations_match_protobufs_own_conversion(ms):
    ts, d = Timestamp(), Duration()
    ts.FromMilliseconds(ms)
    d.FromMilliseconds(ms)
    assert (timestamp(ms), duration(ms)) == (ts, d)


def props_of_polled() -> dict[str, str]:
    return dict(polled().message.properties)


def polled(**changes) -> PolledMessage:
    message = MessageExt(
        topic="T",
        body=b"payload",
        properties={
            "UNIQ_KEY": "AC11000100002A9F0000000000000001",
            "TAGS": "tagA",
            "KEYS": "k1 k2",
            "POP_CK": POP_CK,
            "color": "blue",
        },
        queue_id=1,
        queue_offset=5,
        commit_log_offset=777,
        born_timestamp=1_700_000_000_001,
        born_host=("10.0.0.1", 5555),
        store_timestamp=1_700_000_000_002,
        store_host=("10.0.0.2", 10911),
        reconsume_times=2,
    )
    for name, value in changes.items():
        setattr(message, name, value)
    return PolledMessage("broker-a", "G", message)


def test_a_normal_message():
    got = to_api_message(polled())
    system = got.system_properties
    assert (got.topic.name, got.topic.resource_namespace, got.body) == ("T", "", b"payload")
    assert dict(got.user_properties) == {"color": "blue"}
    assert system.message_id == "AC11000100002A9F0000000000000001"
    assert (system.tag, list(system.keys)) == ("tagA", ["k1", "k2"])
    assert system.body_digest.type == pb.DigestType.MD5
    assert system.body_digest.checksum == hashlib.md5(b"payload").hexdigest().upper()
    assert system.body_encoding == pb.Encoding.IDENTITY
    assert system.message_type == pb.MessageType.NORMAL
    assert system.born_timestamp == timestamp(1_700_000_000_001)
    assert system.store_timestamp == timestamp(1_700_000_000_002)
    # The broker's born host (the proxy it came through), without its port, as the Apache
    # proxy writes it when the message carries no __BORNHOST of its producer's.
    assert (system.born_host, system.store_host) == ("10.0.0.1", "10.0.0.2:10911")
    client = to_api_message(polled(properties={**props_of_polled(), "__BORNHOST": "app-7"}))
    assert client.system_properties.born_host == "app-7"
    assert "__BORNHOST" not in client.user_properties
    assert system.receipt_handle == f"{POP_CK} 777"
    assert (system.queue_id, system.queue_offset) == (1, 5)
    assert system.invisible_duration == duration(30_000)
    assert system.delivery_attempt == 3
    assert not system.HasField("delivery_timestamp") and not system.HasField("message_group")


def test_timed_fifo_and_compressed_messages():
    timed = polled()
    timed.message.properties["TIMER_DELIVER_MS"] = "1700000009000"
    system = to_api_message(timed).system_properties
    assert system.message_type == pb.MessageType.DELAY
    assert system.delivery_timestamp == timestamp(1_700_000_009_000)

    fifo = polled()
    fifo.message.properties["__SHARDINGKEY"] = "order-1"
    system = to_api_message(fifo).system_properties
    assert (system.message_type, system.message_group) == (pb.MessageType.FIFO, "order-1")

    packed = polled(body=zlib.compress(b"payload"), sys_flag=SYSFLAG_COMPRESSED)
    got = to_api_message(packed)
    assert got.body == b"payload"
    assert got.system_properties.body_digest.checksum == hashlib.md5(b"payload").hexdigest().upper()


def test_trace_context_and_dead_letter_origin_reach_the_consumer():
    """TRACE_CONTEXT comes back as ``trace_context``; a message read from a %DLQ% topic
    names where it came from (``dead_letter_queue``), and neither is a user property."""
    props = {
        "UNIQ_KEY": "AC11000100002A9F0000000000000001",
        "POP_CK": POP_CK,
        "TRACE_CONTEXT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "DLQ_ORIGIN_TOPIC": "T",
        "DLQ_ORIGIN_MESSAGE_ID": "AC11000100002A9F0000000000000000",
    }
    got = to_api_message(polled(properties=props))
    system = got.system_properties
    assert system.trace_context == props["TRACE_CONTEXT"]
    assert (system.dead_letter_queue.topic, system.dead_letter_queue.message_id) == (
        "T",
        "AC11000100002A9F0000000000000000",
    )
    assert dict(got.user_properties) == {"TRACE_CONTEXT": props["TRACE_CONTEXT"]}
    plain = to_api_message(polled()).system_properties
    assert not plain.HasField("trace_context") and not plain.HasField("dead_letter_queue")


@pytest.mark.parametrize(
    ("stored", "name", "namespace"),
    [
        ("T", "T", ""),
        ("ns1%T", "T", "ns1"),
        ("%RETRY%ns%G", "%RETRY%G", "ns"),
        ("%DLQ%ns%G", "%DLQ%G", "ns"),
        ("a%b%c", "b%c", "a"),  # cut at the first '%'
        ("%T", "%T", ""),  # a '%' first is no namespace's end
        ("ns%", "", "ns"),
        ("rmq_sys_a%b", "rmq_sys_a%b", ""),  # system topics are never split
        ("CID_RMQ_SYS_a%b", "CID_RMQ_SYS_a%b", ""),
        ("TBW102", "TBW102", ""),
    ],
)
def test_a_stored_topic_is_split_into_name_and_namespace_as_the_apache_proxy_does(
    stored, name, namespace
):
    got = to_api_message(polled(topic=stored))
    assert (got.topic.name, got.topic.resource_namespace) == (name, namespace)
