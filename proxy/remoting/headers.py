"""The custom headers (``extFields``) of the remoting requests and responses we use, typed.

One class per header, each field with its wire name, so the proxy's broker client and the
broker stub spell every name once, here. Values travel as strings; ``encode`` writes them,
``decode`` reads them back into their types and raises ``HeaderError`` naming a field that
is required and missing, or not a number.

Names and defaults are RocketMQ's (``*RequestHeader`` / ``*ResponseHeader`` classes of
rocketmq-remoting); see ``docs/real-rocketmq.md`` for where a real broker's answers differ
from what a reader might expect.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

# initMode of a POP for a group the broker has no offset for: start at the newest message
# (RocketMQ's ConsumeInitMode.MAX), or at the oldest (MIN).
INIT_MODE_MIN = 0
INIT_MODE_MAX = 1


class HeaderError(ValueError):
    """A required header field is missing, or a number is not one."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"the custom field <{name}> {problem}")
        self.name = name


def wire(name: str, default: Any = dataclasses.MISSING, *, kw_only: bool = False) -> Any:
    """A header field named ``name`` on the wire; without a default it is required.

    ``kw_only``: an optional field a subclass's required fields may follow."""
    return field(default=default, kw_only=kw_only, metadata={"wire": name})


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Header:
    """Base of every header: encode to and decode from a command's ``extFields``."""

    # Short names some requests may use instead (SEND_MESSAGE_V2): short -> long wire name.
    ALIASES: ClassVar[dict[str, str]] = {}

    def encode(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for f, _ in _fields(type(self)):  # type: ignore[arg-type]  # a class is hashable: mypy#11470
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.metadata["wire"]] = (
                ("true" if value else "false") if isinstance(value, bool) else str(value)
            )
        return out

    @classmethod
    def decode(cls, ext_fields: dict[str, str] | None) -> Self:
        raw = ext_fields or {}
        if cls.ALIASES:
            raw = {cls.ALIASES.get(k, k): v for k, v in raw.items()}
        values: dict[str, Any] = {}
        for f, kind in _fields(cls):  # type: ignore[arg-type]  # a class is hashable: mypy#11470
            name = f.metadata["wire"]
            text = raw.get(name)
            if text is None or text == "":
                if f.default is dataclasses.MISSING:
                    raise HeaderError(name, "is null")
                continue  # the dataclass default
            values[f.name] = _parse(name, text, kind)
        return cls(**values)


def _parse(name: str, text: str, kind: type) -> Any:
    if kind is bool:
        return text.lower() == "true"
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise HeaderError(name, f"is not a number: {text!r}") from None
    return text


@functools.cache
def _fields(cls: type[Header]) -> tuple[tuple[dataclasses.Field[Any], type], ...]:
    """The wire fields of ``cls`` with their value type (``int | None`` reads as int)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if "wire" not in f.metadata:
            continue
        kind = hints[f.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        out.append((f, args[0] if args else kind))
    return tuple(out)


# -- produce ------------------------------------------------------------------------------


@dataclass(slots=True)
class SendMessageHeader(Header):
    """SEND_MESSAGE (10) with these names; SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE
    (320) with the one-letter names of ``ALIASES`` (``encode_v2``)."""

    ALIASES: ClassVar[dict[str, str]] = {
        "a": "producerGroup",
        "b": "topic",
        "c": "defaultTopic",
        "d": "defaultTopicQueueNums",
        "e": "queueId",
        "f": "sysFlag",
        "g": "bornTimestamp",
        "h": "flag",
        "i": "properties",
        "j": "reconsumeTimes",
        "k": "unitMode",
        "l": "maxReconsumeTimes",
        "m": "batch",
        "n": "brokerName",
    }

    producer_group: str = wire("producerGroup")
    topic: str = wire("topic")
    default_topic: str = wire("defaultTopic", "TBW102")
    default_topic_queue_nums: int = wire("defaultTopicQueueNums", 4)
    queue_id: int = wire("queueId", -1)
    sys_flag: int = wire("sysFlag", 0)
    born_timestamp: int | None = wire("bornTimestamp", None)
    flag: int = wire("flag", 0)
    properties: str = wire("properties", "")
    reconsume_times: int = wire("reconsumeTimes", 0)
    unit_mode: bool = wire("unitMode", False)
    max_reconsume_times: int | None = wire("maxReconsumeTimes", None)
    batch: bool = wire("batch", False)
    broker_name: str | None = wire("brokerName", None)

    def encode_v2(self) -> dict[str, str]:
        long_to_short = {long: short for short, long in self.ALIASES.items()}
        return {long_to_short[k]: v for k, v in self.encode().items()}


@dataclass(slots=True)
class SendMessageResponseHeader(Header):
    msg_id: str = wire("msgId", "")  # the offset message id
    queue_id: int = wire("queueId", -1)
    queue_offset: int = wire("queueOffset", -1)
    transaction_id: str = wire("transactionId", "")  # the client's unique key
    # RocketMQ 5.3.2+: set for a timed message, which RECALL_MESSAGE can take back.
    recall_handle: str | None = wire("recallHandle", None)


# -- transactions and recall --------------------------------------------------------------


@dataclass(slots=True)
class EndTransactionHeader(Header):
    """END_TRANSACTION (37): commit (8) or roll back (12) the half message at these
    offsets."""

    producer_group: str = wire("producerGroup")
    tran_state_table_offset: int = wire("tranStateTableOffset")
    commit_log_offset: int = wire("commitLogOffset")
    commit_or_rollback: int = wire("commitOrRollback")
    msg_id: str = wire("msgId")
    topic: str | None = wire("topic", None)
    from_transaction_check: bool = wire("fromTransactionCheck", False)
    transaction_id: str | None = wire("transactionId", None)


@dataclass(slots=True)
class CheckTransactionStateHeader(Header):
    """CHECK_TRANSACTION_STATE (39): a broker asks a producer of the half message's group
    what became of it; the body is the half message."""

    tran_state_table_offset: int = wire("tranStateTableOffset")
    commit_log_offset: int = wire("commitLogOffset")
    msg_id: str | None = wire("msgId", None)
    transaction_id: str | None = wire("transactionId", None)
    offset_msg_id: str | None = wire("offsetMsgId", None)
    topic: str | None = wire("topic", None)


@dataclass(slots=True)
class RecallMessageHeader(Header):
    """RECALL_MESSAGE (370, RocketMQ 5.3.2+): take back a timed message before its time."""

    producer_group: str = wire("producerGroup")
    topic: str = wire("topic")
    recall_handle: str = wire("recallHandle")


@dataclass(slots=True)
class RecallMessageResponseHeader(Header):
    msg_id: str = wire("msgId", "")


# -- consume ------------------------------------------------------------------------------


@dataclass(slots=True)
class PopMessageHeader(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    queue_id: int = wire("queueId")  # -1: every queue
    max_msg_nums: int = wire("maxMsgNums")
    invisible_time: int = wire("invisibleTime")
    poll_time: int = wire("pollTime", 0)  # ms the broker may hold the request
    born_time: int = wire("bornTime", 0)  # epoch ms the request was made
    init_mode: int = wire("initMode", INIT_MODE_MAX)
    exp_type: str | None = wire("expType", None)
    exp: str | None = wire("exp", None)
    order: bool = wire("order", False)
    attempt_id: str | None = wire("attemptId", None)


@dataclass(slots=True)
class PopMessageResponseHeader(Header):
    pop_time: int = wire("popTime", 0)
    invisible_time: int = wire("invisibleTime", 0)
    revive_qid: int = wire("reviveQid", 0)
    rest_num: int = wire("restNum", 0)
    # "retry queueId startOffset;..." and "retry queueId offset,offset;..." (popinfo.py)
    start_offset_info: str | None = wire("startOffsetInfo", None)
    msg_offset_info: str | None = wire("msgOffsetInfo", None)
    order_count_info: str | None = wire("orderCountInfo", None)


@dataclass(slots=True)
class NotificationHeader(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    queue_id: int = wire("queueId")
    poll_time: int = wire("pollTime", 0)
    born_time: int = wire("bornTime", 0)
    order: bool = wire("order", False)
    attempt_id: str | None = wire("attemptId", None)


@dataclass(slots=True)
class NotificationResponseHeader(Header):
    has_msg: bool = wire("hasMsg", False)
    polling_full: bool = wire("pollingFull", False)  # RocketMQ 5.3.2+


@dataclass(slots=True)
class AckMessageHeader(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")  # the retry topic for a message popped from it
    queue_id: int = wire("queueId")
    extra_info: str = wire("extraInfo")  # the message's POP_CK
    offset: int = wire("offset")
    # A lite message (5.5): its lite topic's short name; topic is then the parent, queue_id
    # 0 and offset the message's offset in the lite queue.
    lite_topic: str | None = wire("liteTopic", None, kw_only=True)


@dataclass(slots=True)
class ChangeInvisibleTimeHeader(AckMessageHeader):
    """An ack's fields, and the new invisible time from now."""

    invisible_time: int = wire("invisibleTime")
    # Lite (5.5): the client suspends the lite topic (ChangeInvisibleDurationRequest.suspend).
    suspend: bool | None = wire("suspend", None, kw_only=True)


@dataclass(slots=True)
class ChangeInvisibleTimeResponseHeader(Header):
    pop_time: int = wire("popTime")
    invisible_time: int = wire("invisibleTime")
    revive_qid: int = wire("reviveQid")


@dataclass(slots=True)
class PollingInfoHeader(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    queue_id: int = wire("queueId")


@dataclass(slots=True)
class PollingInfoResponseHeader(Header):
    polling_num: int = wire("pollingNum", 0)


# -- lite topics (RocketMQ 5.5, RIP-83) ----------------------------------------------------


@dataclass(slots=True)
class PopLiteMessageHeader(Header):
    """POP_LITE_MESSAGE (200070): pop what the broker has queued for this client's lite
    subscriptions of ``topic`` (the parent); with ``poll_time`` the broker parks the request
    under the client id until a lite queue of the client gets a message. NB ``maxMsgNum``,
    not POP's ``maxMsgNums``."""

    client_id: str = wire("clientId")
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    max_msg_num: int = wire("maxMsgNum")
    invisible_time: int = wire("invisibleTime")
    poll_time: int = wire("pollTime")
    born_time: int = wire("bornTime")
    attempt_id: str | None = wire("attemptId", None)


@dataclass(slots=True)
class PopLiteMessageResponseHeader(Header):
    """The 5.5.0 broker sets no offset info: each message's lite-queue offset is its
    ``INNER_MULTI_QUEUE_OFFSET`` property. ``orderCountInfo``: one reconsume count per
    message, in order, joined by ``;``."""

    pop_time: int = wire("popTime")
    invisible_time: int = wire("invisibleTime")
    revive_qid: int = wire("reviveQid")
    start_offset_info: str | None = wire("startOffsetInfo", None)
    msg_offset_info: str | None = wire("msgOffsetInfo", None)
    order_count_info: str | None = wire("orderCountInfo", None)


@dataclass(slots=True)
class NotifyUnsubscribeLiteHeader(Header):
    """NOTIFY_UNSUBSCRIBE_LITE (200073), broker to the connection a client's subscription
    came on: the client no longer holds ``lite_topic`` (an exclusive group gave it to
    another client, or the lite topic expired). No answer is expected."""

    lite_topic: str = wire("liteTopic")
    consumer_group: str = wire("consumerGroup")
    client_id: str = wire("clientId")


@dataclass(slots=True)
class TriggerLiteDispatchHeader(Header):
    """TRIGGER_LITE_DISPATCH (200079, admin): re-dispatch the group's lite events."""

    group: str = wire("group")
    client_id: str | None = wire("clientId", None)


@dataclass(slots=True)
class ConsumerSendMsgBackHeader(Header):
    offset: int = wire("offset")  # commit-log offset
    group: str = wire("group")
    delay_level: int = wire("delayLevel", 0)  # -1: straight to the dead-letter queue
    origin_msg_id: str | None = wire("originMsgId", None)
    origin_topic: str | None = wire("originTopic", None)
    max_reconsume_times: int | None = wire("maxReconsumeTimes", None)


# -- queues, topics, routes ---------------------------------------------------------------


@dataclass(slots=True)
class QueueOffsetHeader(Header):
    """GET_MAX_OFFSET (30) and GET_MIN_OFFSET (31)."""

    topic: str = wire("topic")
    queue_id: int = wire("queueId")


@dataclass(slots=True)
class OffsetResponseHeader(Header):
    offset: int = wire("offset")


@dataclass(slots=True)
class TopicHeader(Header):
    """GET_ROUTEINFO_BY_TOPIC (105), GET_TOPIC_CONFIG (351), GET_TOPIC_STATS_INFO (202)."""

    topic: str = wire("topic")


@dataclass(slots=True)
class CreateTopicHeader(Header):
    """UPDATE_AND_CREATE_TOPIC (17)."""

    topic: str = wire("topic")
    default_topic: str = wire("defaultTopic", "TBW102")
    read_queue_nums: int | None = wire("readQueueNums", None)
    write_queue_nums: int | None = wire("writeQueueNums", None)
    perm: int = wire("perm", 6)
    topic_filter_type: str = wire("topicFilterType", "SINGLE_TAG")
    topic_sys_flag: int = wire("topicSysFlag", 0)
    order: bool = wire("order", False)
    attributes: str | None = wire("attributes", None)  # e.g. "+message.type=FIFO"


@dataclass(slots=True)
class GroupHeader(Header):
    """GET_SUBSCRIPTIONGROUP_CONFIG (352)."""

    group: str = wire("group")


@dataclass(slots=True)
class ConsumeStatsHeader(Header):
    """GET_CONSUME_STATS (208): a group's offsets on one topic (mqadmin consumerProgress)."""

    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")


@dataclass(slots=True)
class ConsumeTimeSpanHeader(Header):
    """QUERY_CONSUME_TIME_SPAN (303): per queue of a topic, the store times around a
    group's offset (QueryConsumeTimeSpanRequestHeader)."""

    topic: str = wire("topic")
    group: str = wire("group")


@dataclass(slots=True)
class UnregisterClientHeader(Header):
    """UNREGISTER_CLIENT (35): the client leaves a producer or a consumer group."""

    client_id: str = wire("clientID")
    producer_group: str | None = wire("producerGroup", default=None)
    consumer_group: str | None = wire("consumerGroup", default=None)


# -- name server --------------------------------------------------------------------------


@dataclass(slots=True)
class RegisterBrokerHeader(Header):
    broker_name: str = wire("brokerName")
    broker_addr: str = wire("brokerAddr")
    cluster_name: str = wire("clusterName")
    broker_id: int = wire("brokerId")
    ha_server_addr: str = wire("haServerAddr", "")
    heartbeat_timeout_millis: int | None = wire("heartbeatTimeoutMillis", None)
    compressed: bool = wire("compressed", False)
    body_crc32: int = wire("bodyCrc32", 0)


@dataclass(slots=True)
class UnregisterBrokerHeader(Header):
    broker_name: str = wire("brokerName")
    broker_addr: str = wire("brokerAddr", "")
    cluster_name: str = wire("clusterName", "")
    broker_id: int = wire("brokerId", 0)


@dataclass(slots=True)
class BrokerHeartbeatHeader(Header):
    broker_name: str = wire("brokerName")
    cluster_name: str = wire("clusterName", "")
    broker_addr: str = wire("brokerAddr", "")
    broker_id: int = wire("brokerId", 0)
