"""Message types: a topic's ``message.type`` attribute, and the type of a message to send.

RocketMQ 5 types a topic with its ``message.type`` attribute (NORMAL, FIFO, DELAY,
TRANSACTION, PRIORITY, LITE, MIXED) and a message by its properties. The Apache proxy reads
the attribute from a broker's topic config (GET_TOPIC_CONFIG), advertises in each route what
the topic accepts, and refuses a message of another type. Brokers check nothing: a
5.5.0 broker stores any type in any topic.

We differ on one point, on purpose: a topic with no attribute at all (what mqadmin and the
tests create unless told otherwise) is NORMAL to the Apache proxy, which then refuses FIFO,
delayed and transactional messages to it; we accept those as this proxy always has
(``UNTYPED``). A topic whose broker did not answer (``UNKNOWN``) accepts every type we can
send: the broker does not check, and the route is learnt again at its next refresh.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from proxy.remoting.message import Prop

MESSAGE_TYPE_ATTRIBUTE = "message.type"


class MessageType(enum.Enum):
    """RocketMQ's ``TopicMessageType`` values, plus our two for a topic not typed."""

    UNSPECIFIED = "UNSPECIFIED"
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    PRIORITY = "PRIORITY"
    LITE = "LITE"
    MIXED = "MIXED"
    UNTYPED = ""  # the topic has no message.type attribute
    UNKNOWN = "?"  # no broker told us the topic's config


# What a MIXED topic advertises in the Apache proxy, and what we let an untyped topic take.
MIXED_TYPES = frozenset(
    {MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION}
)
_SENDABLE = MIXED_TYPES | {MessageType.PRIORITY, MessageType.LITE}


def topic_message_type(config: Mapping[str, object]) -> MessageType:
    """The type of a topic from its TopicConfig JSON (GET_TOPIC_CONFIG's body)."""
    attributes = config.get("attributes")
    value = attributes.get(MESSAGE_TYPE_ATTRIBUTE) if isinstance(attributes, Mapping) else None
    if not isinstance(value, str) or not value:
        return MessageType.UNTYPED
    try:
        return MessageType(value)
    except ValueError:
        return MessageType.UNKNOWN  # a type newer than this proxy: let the broker decide


def accepted_types(topic_type: MessageType) -> frozenset[MessageType]:
    """The message types a route of a topic of ``topic_type`` advertises (the Apache
    proxy's RouteActivity.parseTopicMessageType, but for UNTYPED and UNKNOWN)."""
    if topic_type is MessageType.UNKNOWN:
        return _SENDABLE
    if topic_type in (MessageType.MIXED, MessageType.UNTYPED):
        return MIXED_TYPES
    return frozenset({topic_type})


def accepts(topic_type: MessageType, message_type: MessageType) -> bool:
    """Whether a message of ``message_type`` may be sent to the topic (the Apache proxy's
    DefaultTopicMessageTypeValidator: the same type, or any type to a MIXED topic)."""
    if topic_type in (MessageType.MIXED, MessageType.UNKNOWN):
        return True
    return message_type in accepted_types(topic_type)


def message_type_of(properties: Mapping[str, str]) -> MessageType:
    """The type of a message from its broker properties, in the order RocketMQ's
    TopicMessageType.parseFromMessageProperty decides it."""
    if properties.get(Prop.TRANSACTION_PREPARED) == "true":
        return MessageType.TRANSACTION
    if any(
        key in properties
        for key in (Prop.DELAY, Prop.TIMER_DELIVER_MS, "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
    ):
        return MessageType.DELAY
    if Prop.SHARDING_KEY in properties:
        return MessageType.FIFO
    if Prop.PRIORITY in properties:
        return MessageType.PRIORITY
    if Prop.LITE_TOPIC in properties:
        return MessageType.LITE
    return MessageType.NORMAL
