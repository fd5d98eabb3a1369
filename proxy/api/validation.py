"""Validation of client requests, as the Apache RocketMQ proxy 5.5 validates them: its
checks, answered with its status code and, where clients see it, its message text
(docs/api.md, "Request limits"). The limits it has as settings are settings here too
(``proxy.config.LimitsConfig``, ``max_body_bytes``, ``max_lite_topic_size``, the receive
polling bounds). A few checks are this proxy's own; docs/api.md lists them."""

from __future__ import annotations

import re
from collections.abc import Mapping

from google.protobuf.duration_pb2 import Duration

from proxy.api.context import Context
from proxy.api.errors import ApiError, Code
from proxy.api.v2 import definition_pb2 as pb
from proxy.remoting.filter import ExpressionType, FilterExpressionError, TagFilter
from proxy.remoting.message import Prop
from proxy.remoting.popinfo import RETRY_GROUP_TOPIC_PREFIX

CLIENT_ID_HEADER = "x-mq-client-id"
CLIENT_VERSION_HEADER = "x-mq-client-version"
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 120
# The most messages one pop may ask a broker for; a receive asking more gets this many.
MAX_BATCH = 32

# Topic and group names: these characters only (the pattern as the messages quote it).
NAME_PATTERN = "^[%|a-zA-Z0-9_-]+$"
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
_LITE_TOPIC = re.compile(r"[a-zA-Z0-9_-]+")
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "CHECKPOINT_TOPIC",
        "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC",
        "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC",
    }
)
# Retry (%RETRY%<group>) and dead-letter (%DLQ%<group>) topics are not system topics: a
# client may send to them and consume them, as through the Apache proxy.
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"

# Properties the broker and proxy own: a client may not set them as user properties, and
# they are not handed to consumers as such (convert.py). The Apache proxy's set, and those
# this proxy sets itself.
RESERVED_PROPERTIES = frozenset(
    {
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
        Prop.BORN_HOST,
        Prop.DLQ_ORIGIN_TOPIC,
        Prop.DLQ_ORIGIN_MESSAGE_ID,
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
        "ARRIVE_TIME",
        "BORN_TIMESTAMP",
        "BUYER_ID",
        "CONSUME_START_TIME",
        "CORRECTION_FLAG",
        "CORRELATION_ID",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INNER_BASE",
        "INNER_NUM",
        "INSTANCE_ID",
        "MAX_OFFSET",
        "MIN_OFFSET",
        "MQ2_FLAG",
        "MSG_TYPE",
        "ORIGIN_GROUP",
        "POP_CK_OFFSET",
        "PUSH_REPLY_TIME",
        "REPLY_TO_CLIENT",
        "TIMER_DELAY_LEVEL",
        "TIMER_DELAY_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DEQUEUE_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TRANSFER_FLAG",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "TTL",
        "__CRC32#",
        "__transactionId__",
    }
)

# Clients older than this do not know ILLEGAL_POLLING_TIME; they are told BAD_REQUEST. The
# versions compare as strings, as the Apache proxy compares them.
ILLEGAL_POLLING_TIME_SINCE = "5.0.3"

# Whitespace to str.isspace, not to Java's Character.isWhitespace: no-break spaces and NEL.
_NOT_JAVA_WHITESPACE = frozenset("\xa0\u2007\u202f\x85")


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
        raise ApiError(Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
    return value


def is_blank(text: str) -> bool:
    """Empty or whitespace only, by Java's definition of whitespace (the clients' and the
    Apache proxy's)."""
    return all(c.isspace() and c not in _NOT_JAVA_WHITESPACE for c in text)


def has_control_chars(text: str) -> bool:
    """Any ISO control character: U+0000-U+001F or U+007F-U+009F."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def validate_topic(topic: str) -> str:
    if is_blank(topic):
        raise ApiError(Code.ILLEGAL_TOPIC, "The specified topic is blank")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise ApiError(
            Code.ILLEGAL_TOPIC,
            f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH}.",
        )
    if not _NAME.fullmatch(topic):
        raise ApiError(
            Code.ILLEGAL_TOPIC,
            f"The specified topic[{topic}] contains illegal characters, "
            f"allowing only {NAME_PATTERN}",
        )
    if is_system_topic(topic):
        raise ApiError(Code.ILLEGAL_TOPIC, "cannot access system topic")
    return topic


def is_system_topic(name: str) -> bool:
    """One of RocketMQ's own topics (TopicValidator.isSystemTopic)."""
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIX)


def validate_receive_topic(topic: str) -> str:
    """A topic a consumer may pop: not a retry topic. A 5.5.0 broker cannot revive a message
    popped from ``%RETRY%<group>`` by a consumer group (KeyBuilder.parseNormalTopic fails
    on it) and retries it for good, which stops every later redelivery of its revive queue,
    one of the broker's eight. The Apache proxy lets the pop through; this proxy refuses
    it (a retry topic's messages come back to its own group's consumers anyway)."""
    validate_topic(topic)
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        raise ApiError(
            Code.ILLEGAL_TOPIC,
            f"cannot receive from retry topic {topic}: a broker cannot redeliver what is "
            "popped from it; its messages come back to its group's own consumers",
        )
    return topic


def validate_group(group: str) -> str:
    if is_blank(group):
        raise ApiError(Code.ILLEGAL_CONSUMER_GROUP, "the specified group is blank")
    if len(group) > GROUP_MAX_LENGTH:
        raise ApiError(
            Code.ILLEGAL_CONSUMER_GROUP,
            f"the specified group[{group}] is longer than group max length: {GROUP_MAX_LENGTH}.",
        )
    if not _NAME.fullmatch(group):
        raise ApiError(
            Code.ILLEGAL_CONSUMER_GROUP,
            f"the specified group[{group}] contains illegal characters, "
            f"allowing only {NAME_PATTERN}",
        )
    if group.startswith(SYSTEM_GROUP_PREFIX):
        raise ApiError(Code.ILLEGAL_CONSUMER_GROUP, "cannot use system consumer group")
    return group


def validate_lite_topic(name: str, max_size: int) -> str:
    """A lite topic name (RocketMQ 5.5): of a send, or of a PARTIAL_ADD subscription."""
    if is_blank(name):
        raise ApiError(
            Code.ILLEGAL_LITE_TOPIC, "lite topic cannot be the char sequence of whitespace"
        )
    if utf8_size(name) > max_size:
        raise ApiError(Code.ILLEGAL_LITE_TOPIC, f"lite topic exceed the max size {max_size}")
    if not _LITE_TOPIC.fullmatch(name):
        raise ApiError(
            Code.ILLEGAL_LITE_TOPIC,
            "lite topic can only contain alphanumeric characters, hyphens(-), and underscores(_)",
        )
    return name


def duration_ms(duration: Duration) -> int:
    """Whole milliseconds, truncated toward zero as protobuf's Durations.toMillis does."""
    millis = abs(duration.nanos) // 1_000_000
    return duration.seconds * 1000 + (millis if duration.nanos >= 0 else -millis)


def validate_invisible(ms: int, minimum: int, maximum: int) -> int:
    """An invisible time within [minimum, maximum] (maximum 0: no upper limit)."""
    if ms < minimum:
        raise ApiError(
            Code.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too small. min is {minimum}"
        )
    if 0 < maximum < ms:
        raise ApiError(
            Code.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too large. max is {maximum}"
        )
    return ms


def polling_time_error(context: Context) -> ApiError:
    """A poll the client's deadline leaves too little time for: ILLEGAL_POLLING_TIME for
    clients that know the code, BAD_REQUEST for older ones and those that send no version."""
    version = metadata_value(context, CLIENT_VERSION_HEADER)
    old = version is None or version < ILLEGAL_POLLING_TIME_SINCE
    return ApiError(
        Code.BAD_REQUEST if old else Code.ILLEGAL_POLLING_TIME,
        "The deadline time remaining is not enough for polling, please check network condition",
    )


def validate_batch_size(size: int) -> int:
    """Sizes above 32 are cut to 32 (brokers refuse more); zero or less is refused."""
    if size <= 0:
        raise ApiError(Code.BAD_REQUEST, f"batch size {size} must be positive")
    return min(size, MAX_BATCH)


def validate_filter(expression: str, filter_type: int) -> tuple[str, ExpressionType]:
    """A tag expression, parsed here; or a SQL92 expression, which only a broker parses (a
    malformed one is its refusal, ``errors.receive_error``). An empty SQL92 expression is
    refused here, in the Apache proxy's words."""
    if filter_type == pb.FilterType.SQL:
        if not expression:
            raise ApiError(Code.ILLEGAL_FILTER_EXPRESSION, "Expression can't be null! SQL92")
        return expression, ExpressionType.SQL92
    try:
        TagFilter.parse(expression)
    except FilterExpressionError as exc:
        raise ApiError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
    return expression.strip() or "*", ExpressionType.TAG


def validate_tag(tag: str) -> str:
    """A message's tag, when it has one (an empty tag is none)."""
    if is_blank(tag):
        raise ApiError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot be the char sequence of whitespace")
    if "|" in tag:
        raise ApiError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
    if has_control_chars(tag):
        raise ApiError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")
    return tag


def validate_key(key: str) -> str:
    """One message key; an empty key passes."""
    if key and is_blank(key):
        raise ApiError(Code.ILLEGAL_MESSAGE_KEY, "key cannot be the char sequence of whitespace")
    if has_control_chars(key):
        raise ApiError(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")
    return key


def user_properties_size(props: Mapping[str, str], max_count: int) -> int:
    """Check a message's user properties; their UTF-8 size, names and values, which counts
    against ``max_user_property_size`` with the tag and keys (``check_properties_size``)."""
    if len(props) > max_count:
        raise ApiError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE, f"too many user properties, max is {max_count}"
        )
    size = 0
    for name, value in props.items():
        if name in RESERVED_PROPERTIES:
            raise ApiError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {name}")
        if has_control_chars(name):
            raise ApiError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the key of property cannot contain control character",
            )
        if has_control_chars(value):
            raise ApiError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the value of property cannot contain control character",
            )
        size += utf8_size(name) + utf8_size(value)
    return size


def check_properties_size(size: int, max_size: int) -> None:
    """User properties, tag and keys of one message together, in UTF-8 bytes."""
    if size > max_size:
        raise ApiError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"the total size of user property is too large, max is {max_size}",
        )


def validate_message_id(message_id: str) -> str:
    if is_blank(message_id):
        raise ApiError(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    return message_id


def validate_transaction_recovery(seconds: int, max_seconds: int) -> int:
    if 0 < max_seconds < seconds:
        raise ApiError(
            Code.BAD_REQUEST,
            f"the max transaction recovery time of message is too large, max is {max_seconds}",
        )
    return seconds


def validate_delivery_time(deliver_ms: int, now_ms: int, max_delay_ms: int) -> int:
    """A timed message's delivery time (epoch ms), at most ``max_delay_ms`` ahead."""
    if 0 < max_delay_ms < deliver_ms - now_ms:
        raise ApiError(
            Code.ILLEGAL_DELIVERY_TIME,
            f"the max delay time of message is too large, max is {max_delay_ms}",
        )
    return deliver_ms


def validate_priority(priority: int) -> int:
    if priority < 0:
        raise ApiError(Code.BAD_REQUEST, "The priority must be greater than or equal to 0")
    return priority


def validate_message_group(group: str, max_size: int) -> str:
    """A FIFO message's group, when it has one: shorter than ``max_size`` UTF-8 bytes (0: no
    limit)."""
    if is_blank(group):
        raise ApiError(
            Code.ILLEGAL_MESSAGE_GROUP, "message group cannot be the char sequence of whitespace"
        )
    if max_size <= 0:  # no limit, and (as in the Apache proxy) no control character check
        return group
    if utf8_size(group) >= max_size:
        raise ApiError(Code.ILLEGAL_MESSAGE_GROUP, f"message group exceed the max size {max_size}")
    if has_control_chars(group):
        raise ApiError(Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character")
    return group
