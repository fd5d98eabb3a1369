"""A topic's message type from its config, what its route accepts, and a message's type."""

from __future__ import annotations

import pytest

from proxy.message_types import (
    MIXED_TYPES,
    MessageType,
    accepted_types,
    accepts,
    message_type_of,
    topic_message_type,
)
from proxy.remoting.message import Prop

M = MessageType


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"attributes": {"message.type": "PRIORITY"}}, M.PRIORITY),
        ({"attributes": {"message.type": "MIXED"}}, M.MIXED),
        ({"attributes": {}}, M.UNTYPED),  # what a real broker answers for a plain topic
        ({}, M.UNTYPED),
        ({"attributes": {"message.type": "QUANTUM"}}, M.UNKNOWN),  # newer than us
    ],
)
def test_topic_type_from_config(config, expected):
    assert topic_message_type(config) is expected


def test_what_routes_accept():
    assert accepted_types(M.PRIORITY) == {M.PRIORITY}
    assert accepted_types(M.NORMAL) == {M.NORMAL}
    assert accepted_types(M.UNTYPED) == accepted_types(M.MIXED) == MIXED_TYPES
    assert M.PRIORITY in accepted_types(M.UNKNOWN) and M.LITE in accepted_types(M.UNKNOWN)


def test_what_sends_are_refused():
    assert not accepts(M.PRIORITY, M.NORMAL)
    assert not accepts(M.UNTYPED, M.PRIORITY)
    assert not accepts(M.NORMAL, M.FIFO)
    assert accepts(M.MIXED, M.PRIORITY)  # the Apache proxy lets anything into MIXED
    assert accepts(M.UNKNOWN, M.PRIORITY)
    assert accepts(M.UNTYPED, M.TRANSACTION)


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({Prop.PRIORITY: "3"}, M.PRIORITY),
        ({Prop.PRIORITY: "3", Prop.SHARDING_KEY: "g"}, M.FIFO),
        ({Prop.PRIORITY: "3", Prop.TIMER_DELIVER_MS: "1"}, M.DELAY),
        ({Prop.PRIORITY: "3", Prop.TRANSACTION_PREPARED: "true"}, M.TRANSACTION),
        ({Prop.LITE_TOPIC: "x"}, M.LITE),
        ({}, M.NORMAL),
    ],
)
def test_message_type_in_rocketmqs_order(props, expected):
    assert message_type_of(props) is expected
