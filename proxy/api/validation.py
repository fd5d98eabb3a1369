"""Validation of client requests, with the status codes the RocketMQ 5 clients expect."""

from __future__ import annotations

import re
from collections.abc import Sequence

from google.protobuf.duration_pb2 import Duration

from proxy.api.context import Context
from proxy.api.errors import ApiError, Code
from proxy.api.v2 import definition_pb2 as pb
from proxy.remoting.filter import FilterExpressionError, TagFilter
from proxy.remoting.message import Prop

CLIENT_ID_HEADER = "x-mq-client-id"
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "%RETRY%", "%DLQ%")
_SYSTEM_TOPICS = {
    "TBW102",
    "SCHEDULE_TOPIC_XXXX",
    "BenchmarkTest",
    "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
}
MIN_INVISIBLE_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_BATCH = 32
MAX_PROPERTIES_BYTES = 16 * 1024
MAX_DELIVERY_DELAY_MS = 24 * 3600 * 1000

# Properties the broker and proxy own; a client may not set them as user properties.
RESERVED_PROPERTIES = {
    Prop.KEYS,
    Prop.TAGS,
    Prop.UNIQ_KEY,
    Prop.WAIT,
    Prop.DELAY,
    Prop.RETRY_TOPIC,
    Prop.REAL_TOPIC,
    Prop.REAL_QUEUE_ID,
    Prop.ORIGIN_MESSAGE_ID,
    Prop.RECONSUME_TIME,
    Prop.MAX_RECONSUME_TIMES,
    Prop.POP_CK,
    Prop.FIRST_POP_TIME,
    Prop.MSG_REGION,
    Prop.TRACE_ON,
    Prop.SHARDING_KEY,
    Prop.CLUSTER,
    Prop.PRODUCER_GROUP,
    Prop.START_DELIVER_TIME,
    Prop.TIMER_DELIVER_MS,
    Prop.TRANSACTION_PREPARED,
    Prop.CHECK_IMMUNITY_TIME_IN_SECONDS,
    Prop.TRANSACTION_CHECK_TIMES,
    Prop.TIMER_OUT_MS,
    Prop.TIMER_DEL_UNIQKEY,
    Prop.PRIORITY,
    Prop.LITE_TOPIC,
    Prop.INNER_MULTI_DISPATCH,
    Prop.INNER_MULTI_QUEUE_OFFSET,
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "POP_CK_OFFSET",
    "MIN_OFFSET",
    "MAX_OFFSET",
    "__transactionId__",
    "INSTANCE_ID",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "BUYER_ID",
    "CORRECTION_FLAG",
    "MSG_TYPE",
    "TIMER_OUT_MS",
    "__CRC32#",
    "INNER_NUM",
    "INNER_BASE",
}


def metadata_value(context: Context, name: str) -> str | None:
    """The first non-blank text value of the request metadata ``name``, else None."""
    for key, value in context.invocation_metadata() or ():
        if key == name and isinstance(value, str) and value.strip():
            return value
    return None


def require_client_id(context: Context) -> str:
    """Every RPC names its client in the metadata; the clients always send it."""
    value = metadata_value(context, CLIENT_ID_HEADER)
    if value is None:
        raise ApiError(Code.CLIENT_ID_REQUIRED, f"metadata {CLIENT_ID_HEADER} is required")
    return value


def has_control_chars(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def validate_topic(topic: str) -> str:
    if not topic or not topic.strip():
        raise ApiError(Code.ILLEGAL_TOPIC, "topic name cannot be blank")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise ApiError(Code.ILLEGAL_TOPIC, f"topic name is longer than {TOPIC_MAX_LENGTH}")
    if not _NAME.match(topic):
        raise ApiError(Code.ILLEGAL_TOPIC, f"topic name {topic!r} has illegal characters")
    if topic in _SYSTEM_TOPICS or topic.startswith(_SYSTEM_TOPIC_PREFIXES):
        raise ApiError(Code.ILLEGAL_TOPIC, f"topic {topic!r} is a system topic")
    return topic


def validate_group(group: str) -> str:
    if not group or not group.strip():
        raise ApiError(Code.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be blank")
    if len(group) > GROUP_MAX_LENGTH:
        raise ApiError(Code.ILLEGAL_CONSUMER_GROUP, f"group is longer than {GROUP_MAX_LENGTH}")
    if not _NAME.match(group):
        raise ApiError(Code.ILLEGAL_CONSUMER_GROUP, f"group {group!r} has illegal characters")
    return group


_LITE_TOPIC = re.compile(r"^[a-zA-Z0-9_-]+$")


def validate_lite_topic(name: str, max_size: int) -> str:
    """A lite topic name, checked as the Apache proxy 5.5 checks it (GrpcValidator)."""
    if not name or not name.strip():
        raise ApiError(Code.ILLEGAL_LITE_TOPIC, "lite topic cannot be blank")
    if len(name.encode()) > max_size:
        raise ApiError(Code.ILLEGAL_LITE_TOPIC, f"lite topic is longer than {max_size} bytes")
    if not _LITE_TOPIC.match(name):
        raise ApiError(
            Code.ILLEGAL_LITE_TOPIC,
            "lite topic may hold only letters, digits, hyphens (-) and underscores (_)",
        )
    return name


def duration_ms(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def validate_invisible(ms: int, minimum: int = MIN_INVISIBLE_MS) -> int:
    if not minimum <= ms <= MAX_INVISIBLE_MS:
        raise ApiError(
            Code.ILLEGAL_INVISIBLE_TIME,
            f"invisible duration {ms} ms is outside [{minimum}, {MAX_INVISIBLE_MS}] ms",
        )
    return ms


def validate_batch_size(size: int) -> int:
    """Sizes above 32 are clamped (brokers refuse more); zero or less is refused."""
    if size <= 0:
        raise ApiError(Code.BAD_REQUEST, f"batch size {size} must be positive")
    return min(size, MAX_BATCH)


def validate_filter(expression: str, filter_type: int) -> str:
    """Tag expressions only; SQL92 needs broker support this proxy does not offer."""
    if filter_type == pb.FilterType.SQL:
        raise ApiError(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filter expressions are not supported")
    try:
        TagFilter.parse(expression)
    except FilterExpressionError as exc:
        raise ApiError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
    return expression.strip() or "*"


def validate_tag(tag: str) -> str:
    if not tag.strip():
        raise ApiError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot be blank")
    if "|" in tag or has_control_chars(tag):
        raise ApiError(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} contains '|' or control characters")
    return tag


def validate_keys(keys: Sequence[str]) -> list[str]:
    for key in keys:
        if not key.strip() or has_control_chars(key):
            raise ApiError(
                Code.ILLEGAL_MESSAGE_KEY, f"message key {key!r} is blank or has control characters"
            )
    return list(keys)


def validate_user_properties(props: dict[str, str]) -> dict[str, str]:
    size = 0
    for name, value in props.items():
        if not name or name in RESERVED_PROPERTIES or has_control_chars(name):
            raise ApiError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {name!r} is reserved or illegal"
            )
        if has_control_chars(value):
            raise ApiError(Code.BAD_REQUEST, f"property {name!r} has control characters")
        size += len(name.encode()) + len(value.encode())
    if size > MAX_PROPERTIES_BYTES:
        raise ApiError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"properties take {size} bytes, over {MAX_PROPERTIES_BYTES}",
        )
    return dict(props)
