"""The request limits are settings: the activities check what their ``LimitsConfig`` says,
and 0 turns a limit off where the Apache proxy's does (tests/integration/test_request_limits.py
tries the defaults through a running proxy)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from proxy.api import validation as check
from proxy.api.errors import ApiError
from proxy.api.send import SendActivity
from proxy.api.v2 import definition_pb2 as pb
from proxy.config import LimitsConfig
from proxy.remoting.message import Prop

Code = pb.Code


def properties(
    limits: LimitsConfig, client: str = "10.0.0.9:4000", **fields: Any
) -> dict[str, str]:
    """The broker properties SendActivity makes of a message with ``fields``, sent by
    ``client``."""
    activity = SendActivity(cast(Any, None), cast(Any, None), cast(Any, None), 1024, 64, limits)
    props = fields.pop("props", {})
    system = pb.SystemProperties(message_id="M1", **fields)
    return activity._properties(
        pb.Message(body=b"x", system_properties=system, user_properties=props), client
    )


def test_the_born_host_is_the_clients_own_else_its_address():
    """As the Apache proxy writes ``__BORNHOST``: what the client names (the Java client its
    host name), else the address it connects from (through a PROXY header, the balancer's
    client's)."""
    limits = LimitsConfig()
    assert properties(limits, born_host="app-7")[Prop.BORN_HOST] == "app-7"
    assert properties(limits)[Prop.BORN_HOST] == "10.0.0.9:4000"
    assert properties(limits, born_host="  ")[Prop.BORN_HOST] == "10.0.0.9:4000"


def refused(limits: LimitsConfig, **fields: Any) -> tuple[int, str]:
    with pytest.raises(ApiError) as caught:
        properties(limits, **fields)
    return caught.value.code, caught.value.message


def test_property_count_and_size_are_the_settings():
    limits = LimitsConfig(max_user_property_count=2, max_user_property_size=10)
    assert properties(limits, props={"a": "1", "b": "2"})["b"] == "2"
    assert refused(limits, props={"a": "1", "b": "2", "c": "3"}) == (
        Code.MESSAGE_PROPERTIES_TOO_LARGE,
        "too many user properties, max is 2",
    )
    assert properties(limits, props={"a": "1"}, tag="tag", keys=["key12"])[Prop.KEYS] == "key12"
    assert refused(limits, props={"a": "1"}, tag="tag", keys=["key123"]) == (
        Code.MESSAGE_PROPERTIES_TOO_LARGE,
        "the total size of user property is too large, max is 10",
    )


def test_message_group_size_is_the_setting_and_0_is_none():
    assert properties(LimitsConfig(max_message_group_size=128), message_group="g" * 127)
    assert refused(LimitsConfig(max_message_group_size=128), message_group="g" * 128) == (
        Code.ILLEGAL_MESSAGE_GROUP,
        "message group exceed the max size 128",
    )
    # No limit, and (as in the Apache proxy) no control character check either.
    group = "g" * 500 + "\x01"
    assert (
        properties(LimitsConfig(max_message_group_size=0), message_group=group)[Prop.SHARDING_KEY]
        == group
    )


def test_delay_and_recovery_are_the_settings_and_0_is_none():
    far = pb.SystemProperties(message_id="M1").delivery_timestamp
    far.FromSeconds(4_000_000_000)  # in 2096
    assert refused(LimitsConfig(), delivery_timestamp=far)[0] == Code.ILLEGAL_DELIVERY_TIME
    assert properties(LimitsConfig(max_delay_ms=0), delivery_timestamp=far)
    recovery = pb.SystemProperties(message_id="M1").orphaned_transaction_recovery_duration
    recovery.FromSeconds(600)
    transactional = {"message_type": pb.MessageType.TRANSACTION}
    limits = LimitsConfig(max_transaction_recovery_s=300)
    assert refused(limits, orphaned_transaction_recovery_duration=recovery, **transactional) == (
        Code.BAD_REQUEST,
        "the max transaction recovery time of message is too large, max is 300",
    )


def test_invisible_time_bounds_and_0_max_is_none():
    assert check.validate_invisible(5_000, 5_000, 60_000) == 5_000
    with pytest.raises(ApiError) as small:
        check.validate_invisible(4_999, 5_000, 60_000)
    assert small.value.message == "the invisibleTime is too small. min is 5000"
    with pytest.raises(ApiError) as large:
        check.validate_invisible(60_001, 5_000, 60_000)
    assert large.value.message == "the invisibleTime is too large. max is 60000"
    assert check.validate_invisible(10**12, 0, 0) == 10**12


def test_blank_and_control_characters_as_java_has_them():
    assert check.is_blank("") and check.is_blank(" \t\u2003")
    assert not check.is_blank("\xa0")  # a no-break space is not whitespace to Java
    assert check.has_control_chars("a\x7f") and check.has_control_chars("a\x9f")
    assert not check.has_control_chars("a\xa0é")
