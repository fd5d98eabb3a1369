"""Message encodings against records built by hand from RocketMQ's stored-message layout."""

from __future__ import annotations

import struct
import zlib

import pytest

from proxy.remoting.command import RemotingProtocolError
from proxy.remoting.message import (
    MAGIC_V1,
    BatchEntry,
    MessageExt,
    UniqueIdGenerator,
    decode_batch,
    decode_messages,
    decode_properties,
    encode_batch,
    encode_message,
    encode_properties,
    offset_message_id,
)


def hand_record(
    body: bytes,
    topic: str,
    props: str,
    *,
    queue_id=2,
    queue_offset=5,
    phys=1234,
    reconsume=1,
    born=(b"\x0a\x00\x00\x05", 4321),
    store=(b"\x7f\x00\x00\x01", 10911),
    sys_flag=0,
) -> bytes:
    """One stored record, field by field in the order of MessageDecoder.decode."""
    topic_b, props_b = topic.encode(), props.encode()
    fields = (
        struct.pack(">i", MAGIC_V1)
        + struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF)
        + struct.pack(">i", queue_id)
        + struct.pack(">i", 0)  # flag
        + struct.pack(">q", queue_offset)
        + struct.pack(">q", phys)
        + struct.pack(">i", sys_flag)
        + struct.pack(">q", 1_700_000_000_000)  # born timestamp
        + born[0]
        + struct.pack(">i", born[1])
        + struct.pack(">q", 1_700_000_000_500)  # store timestamp
        + store[0]
        + struct.pack(">i", store[1])
        + struct.pack(">i", reconsume)
        + struct.pack(">q", 0)  # prepared transaction offset
        + struct.pack(">i", len(body))
        + body
        + bytes([len(topic_b)])
        + topic_b
        + struct.pack(">h", len(props_b))
        + props_b
    )
    return struct.pack(">i", 4 + len(fields)) + fields


def test_decode_hand_built_records_back_to_back():
    first = hand_record(b"hello", "TopicA", "TAGS\x01t1\x02UNIQ_KEY\x01ABC\x02")
    second = hand_record(b"", "TopicB", "", queue_offset=6, phys=9999, reconsume=0)
    messages = decode_messages(first + second)
    assert len(messages) == 2
    msg = messages[0]
    assert (msg.topic, msg.body, msg.queue_id, msg.queue_offset) == ("TopicA", b"hello", 2, 5)
    assert msg.commit_log_offset == 1234 and msg.reconsume_times == 1
    assert msg.born_host == ("10.0.0.5", 4321)
    assert msg.store_host == ("127.0.0.1", 10911)
    assert msg.born_timestamp == 1_700_000_000_000 and msg.store_timestamp == 1_700_000_000_500
    assert msg.properties == {"TAGS": "t1", "UNIQ_KEY": "ABC"}
    assert msg.tags == "t1" and msg.msg_id == "ABC"
    assert messages[1].topic == "TopicB" and messages[1].msg_id == messages[1].offset_msg_id


def test_encode_matches_the_hand_built_layout():
    msg = MessageExt(
        topic="TopicA",
        body=b"hello",
        properties={"TAGS": "t1", "UNIQ_KEY": "ABC"},
        queue_id=2,
        queue_offset=5,
        commit_log_offset=1234,
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.5", 4321),
        store_timestamp=1_700_000_000_500,
        store_host=("127.0.0.1", 10911),
        reconsume_times=1,
    )
    assert encode_message(msg) == hand_record(
        b"hello", "TopicA", "TAGS\x01t1\x02UNIQ_KEY\x01ABC\x02"
    )
    assert msg.body_crc == zlib.crc32(b"hello") & 0x7FFFFFFF


def test_ipv6_hosts_set_their_sysflag_bits_and_widths():
    msg = MessageExt(topic="T", body=b"b", born_host=("::1", 1), store_host=("fe80::2", 2))
    record = encode_message(msg)
    back = decode_messages(record)[0]
    assert back.sys_flag & 0x10 and back.sys_flag & 0x20
    assert back.born_host == ("::1", 1) and back.store_host == ("fe80::2", 2)
    assert len(record) == len(encode_message(MessageExt(topic="T", body=b"b"))) + 24


@pytest.mark.parametrize(
    "data",
    [
        hand_record(b"x", "T", "")[:-3],  # truncated
        struct.pack(">ii", 40, 0x12345678) + b"\x00" * 32,  # unknown magic
    ],
)
def test_bad_records_raise(data):
    with pytest.raises(RemotingProtocolError):
        decode_messages(data)


def test_properties_format_and_parsing():
    assert encode_properties({"TAGS": "a", "KEYS": "k1 k2"}) == "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    # pairs with an empty name or value are dropped, as RocketMQ's parser does
    assert decode_properties("A\x011\x02\x01x\x02B\x01\x02C\x013") == {"A": "1", "C": "3"}
    assert decode_properties("") == {}


def test_batch_body_hand_built():
    props = b"TAGS\x01t\x02"
    record = (
        struct.pack(">i", 20 + 3 + 2 + len(props))
        + struct.pack(">iiii", 0, 0, 7, 3)  # magic, crc, flag, body length
        + b"abc"
        + struct.pack(">h", len(props))
        + props
    )
    entries = decode_batch(record + record)
    assert [(e.body, e.flag, e.properties) for e in entries] == [(b"abc", 7, {"TAGS": "t"})] * 2
    assert encode_batch([BatchEntry(b"abc", {"TAGS": "t"}, 7)]) == record
    with pytest.raises(RemotingProtocolError):
        decode_batch(record[:-1])


def test_offset_message_id_layout():
    # IP 127.0.0.1, port 10911 (0x2A9F), offset 0x10
    assert offset_message_id(("127.0.0.1", 10911), 16) == "7F00000100002A9F0000000000000010"


def test_unique_ids_are_32_hex_and_distinct():
    gen = UniqueIdGenerator("10.1.2.3")
    ids = [gen.next_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and i == i.upper() for i in ids)
    assert all(i.startswith("0A010203") for i in ids)
