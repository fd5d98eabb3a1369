"""The command codec against byte sequences built by hand from RocketMQ's layout."""

from __future__ import annotations

import json
import struct

import pytest

from proxy.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode
from proxy.remoting.command import (
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    decode,
    encode,
    encode_binary,
)


def json_frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """length | (type << 24 | header length) | header | body, big-endian."""
    return (
        struct.pack(">I", 4 + len(header) + len(body))
        + struct.pack(">I", (serialize_type << 24) | len(header))
        + header
        + body
    )


def test_encode_writes_the_frame_layout_and_a_sorted_json_header():
    cmd = RemotingCommand(code=310, ext_fields={"b": "T", "a": "G"}, body=b"hi", opaque=7)
    frame = encode(cmd)
    (length,) = struct.unpack(">I", frame[:4])
    (word,) = struct.unpack(">I", frame[4:8])
    assert length == len(frame) - 4
    assert word >> 24 == 0  # JSON
    header_len = word & 0xFFFFFF
    header = frame[8 : 8 + header_len]
    assert frame[8 + header_len :] == b"hi"
    obj = json.loads(header)
    assert list(obj) == sorted(obj)  # fastjson writes keys in alphabetical order
    assert obj["code"] == 310 and obj["opaque"] == 7 and obj["flag"] == 0
    assert obj["language"] == "PYTHON"
    assert obj["extFields"] == {"b": "T", "a": "G"}
    assert "remark" not in obj  # nulls are left out


def test_decode_a_hand_built_java_request():
    header = (
        b'{"code":200050,"extFields":{"consumerGroup":"G","queueId":"-1"},'
        b'"flag":0,"language":"JAVA","opaque":42,"serializeTypeCurrentRPC":"JSON","version":479}'
    )
    cmd = decode(json_frame(header, b"xyz")[4:])
    assert cmd.code == 200050
    assert cmd.opaque == 42
    assert cmd.language == LanguageCode.JAVA
    assert cmd.version == 479
    assert cmd.fields == {"consumerGroup": "G", "queueId": "-1"}
    assert cmd.body == b"xyz"
    assert not cmd.is_response and not cmd.is_oneway


def test_decode_accepts_numbers_ordinals_and_missing_fields():
    # The C++ client sends some header values as JSON numbers and the language as an ordinal.
    header = b'{"code":310,"extFields":{"d":4,"e":1,"k":false},"language":1,"opaque":3}'
    cmd = decode(json_frame(header)[4:])
    assert cmd.fields == {"d": "4", "e": "1", "k": "false"}
    assert cmd.language == LanguageCode.CPP
    assert cmd.flag == 0 and cmd.version == 0


def test_response_and_oneway_flags():
    header = b'{"code":0,"flag":1,"opaque":9}'
    assert decode(json_frame(header)[4:]).is_response
    header = b'{"code":15,"flag":2,"opaque":9}'
    assert decode(json_frame(header)[4:]).is_oneway
    request = RemotingCommand(code=34, opaque=5)
    response = request.make_response(0)
    assert response.opaque == 5 and response.flag == FLAG_RESPONSE
    assert FLAG_ONEWAY == 2


def test_decode_binary_rocketmq_header_built_by_hand():
    fields = b""
    for key, value in (("topic", "T"), ("queueId", "3")):
        fields += struct.pack(">h", len(key)) + key.encode()
        fields += struct.pack(">i", len(value)) + value.encode()
    remark = b"hello"
    header = (
        struct.pack(">h", 105)  # code
        + bytes([LanguageCode.CPP])
        + struct.pack(">h", 333)  # version
        + struct.pack(">i", 77)  # opaque
        + struct.pack(">i", 0)  # flag
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(fields))
        + fields
    )
    cmd = decode(json_frame(header, b"B", serialize_type=1)[4:])
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque) == (105, LanguageCode.CPP, 333, 77)
    assert cmd.remark == "hello"
    assert cmd.fields == {"topic": "T", "queueId": "3"}
    assert cmd.body == b"B"
    # and our binary encoder writes the same bytes
    same = RemotingCommand(
        105, {"topic": "T", "queueId": "3"}, b"B", 77, 0, "hello", LanguageCode.CPP, 333
    )
    assert encode_binary(same) == json_frame(header, b"B", serialize_type=1)


def test_binary_header_cannot_carry_pop_codes():
    with pytest.raises(ValueError):
        encode_binary(RemotingCommand(code=200050))


def test_round_trip_keeps_control_characters_in_properties():
    props = "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    cmd = RemotingCommand(code=310, ext_fields={"i": props}, remark="r")
    frame = encode(cmd)
    assert b"\\u0001" in frame  # JSON escapes the separators
    back = decode(frame[4:])
    assert back.fields["i"] == props and back.remark == "r"


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00\x00",  # shorter than the header-length word
        struct.pack(">I", 100) + b"{}",  # header longer than the frame
        struct.pack(">I", 3) + b"{x}",  # not JSON
        struct.pack(">I", 2) + b"[]",  # JSON, not an object
        struct.pack(">I", (7 << 24) | 2) + b"{}",  # unknown serialize type
        struct.pack(">I", 13) + b'{"code":"x"}',  # code not a number
    ],
)
def test_malformed_frames_raise(frame):
    with pytest.raises(RemotingProtocolError):
        decode(frame)


def test_frame_decoder_splits_a_stream_fed_byte_by_byte():
    frames = b"".join(encode(RemotingCommand(code=c, opaque=c, body=b"x" * c)) for c in (1, 2, 3))
    decoder = FrameDecoder()
    got = []
    for i in range(len(frames)):
        got += decoder.feed(frames[i : i + 1])
    assert [(c.code, c.body) for c in got] == [(1, b"x"), (2, b"xx"), (3, b"xxx")]


def test_frame_decoder_refuses_oversized_and_undersized_lengths():
    with pytest.raises(RemotingProtocolError):
        FrameDecoder(max_frame=1024).feed(struct.pack(">I", 1025))
    with pytest.raises(RemotingProtocolError):
        FrameDecoder().feed(struct.pack(">I", 2) + b"\x00\x00")
