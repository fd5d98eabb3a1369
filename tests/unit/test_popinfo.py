from __future__ import annotations

import base64

import orjson
import pytest

from proxy.remoting.filter import FilterExpressionError, TagFilter
from proxy.remoting.popinfo import (
    PopCheckpointInfo,
    batch_ack_body,
    join_info,
    parse_info,
    pop_retry_topic,
    retry_flag,
    topic_for_flag,
)


def test_pop_ck_is_eight_space_separated_fields():
    text = "5 1700000000000 30000 3 1 broker-b 0 7"
    info = PopCheckpointInfo.parse(text)
    assert info == PopCheckpointInfo(5, 1_700_000_000_000, 30_000, 3, 1, "broker-b", 0, 7)
    assert info.encode() == text
    assert info.next_visible_time == 1_700_000_030_000


@pytest.mark.parametrize("text", ["", "1 2 3", "a 1 2 3 0 b 0 1", "1 2 3 4 0 b 0 1 9"])
def test_bad_pop_ck_raises(text):
    with pytest.raises(ValueError):
        PopCheckpointInfo.parse(text)


def test_offset_info_strings():
    text = join_info([(0, 3, "10"), (1, 0, "4,5")])
    assert text == "0 3 10;1 0 4,5"
    assert parse_info(text) == {"0@3": "10", "1@0": "4,5"}
    with pytest.raises(ValueError):
        parse_info("0 3 10;0 3 11")  # repeated key
    with pytest.raises(ValueError):
        parse_info("0 3")


def test_retry_topics_and_flags():
    assert pop_retry_topic("G", "T") == "%RETRY%G_T"
    assert retry_flag("T") == 0
    assert retry_flag("%RETRY%G_T") == 1
    assert retry_flag("%RETRY%G+T") == 2
    assert topic_for_flag(0, "G", "T") == "T"
    assert topic_for_flag(1, "G", "T") == "%RETRY%G_T"
    assert topic_for_flag(2, "G", "T") == "%RETRY%G+T"


def test_tag_filters():
    assert TagFilter.parse("*").matches(None)
    assert TagFilter.parse("").matches("x")
    f = TagFilter.parse("a || b")
    assert f.matches("a") and f.matches("b") and not f.matches("c") and not f.matches(None)
    assert TagFilter.parse("a || ") == TagFilter(frozenset({"a"}))  # empty pieces skipped
    for bad in ("||", " || || ", "a ||| b"):
        with pytest.raises(FilterExpressionError):
            TagFilter.parse(bad)
    with pytest.raises(FilterExpressionError):
        TagFilter.parse("a > 1", "SQL92")


def test_batch_ack_body_groups_by_checkpoint_and_sets_java_bitset_bits():
    # Three messages of one pop from queue 2 (start 100), one from another pop.
    def ck(start: int, offset: int, pop_time: int = 1_700_000_000_000) -> PopCheckpointInfo:
        return PopCheckpointInfo(start, pop_time, 30_000, 0, 0, "broker-a", 2, offset)

    body = orjson.loads(
        batch_ack_body(
            "broker-a", "G", "T", [ck(100, 100), ck(100, 101), ck(100, 109), ck(500, 503, 7)]
        )
    )

    assert body["brokerName"] == "broker-a"
    first, second = body["acks"]
    assert (first["c"], first["t"], first["r"], first["q"]) == ("G", "T", "0", 2)
    assert (first["so"], first["pt"], first["it"], first["rq"]) == (
        100,
        1_700_000_000_000,
        30_000,
        0,
    )
    # Java's BitSet.toByteArray(): bits 0, 1 and 9 are bytes 0x03 0x02.
    assert base64.b64decode(first["b"]) == bytes([0x03, 0x02])
    assert (second["so"], second["pt"], base64.b64decode(second["b"])) == (500, 7, bytes([0x08]))
