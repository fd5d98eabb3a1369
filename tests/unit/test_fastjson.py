"""fastjson.loads: what brokers write, and any text at all (a remoting client's body is
parsed before it is authenticated): a value or FastjsonError, never another exception."""

from __future__ import annotations

import pytest

from proxy.remoting import fastjson
from proxy.remoting.fastjson import MAX_DEPTH, FastjsonError


def test_reads_object_keys_and_bare_number_keys():
    text = '{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"brokerOffset":5}}}'
    key = (("brokerName", "b"), ("queueId", 0), ("topic", "T"))
    assert fastjson.loads(text) == {"offsetTable": {key: {"brokerOffset": 5}}}
    assert fastjson.loads(b'{"brokerAddrs":{0:"127.0.0.1:10911"}}') == {
        "brokerAddrs": {0: "127.0.0.1:10911"}
    }


def test_nesting_up_to_the_bound_is_read():
    assert fastjson.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None


MALFORMED = {
    "one past the depth bound": b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
    "deep arrays": b"[" * 100_000,  # a RecursionError without the bound
    "deep objects": b'{"a":' * 100_000,
    "deep object keys": b"{" * 50_000,
    "a key object with keys of two types": b'{{1:2,"a":3}:4}',  # sorted: a TypeError
    "the same, nested": b'{{"k":{1:2,"a":3}}:4}',
    "not UTF-8": b"\xff\xfe",
    "a bad escape": b'"\\ud800\\x"',
    "past int's digits limit": b"1" * 5_000,
    "no closing brace": b'{"a":1',
    "a trailing comma": b"[1,]",
    "nothing": b"",
    "a cut word": b"nul",
}


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_text_raises_fastjson_error_only(body: bytes):
    with pytest.raises(FastjsonError):
        fastjson.loads(body)
