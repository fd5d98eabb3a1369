"""Lite topics (RocketMQ 5.5, RIP-83) on the wire: the LITE_SUBSCRIPTION_CTL body and the
name of a lite topic's queue.

A lite topic is a name under a parent topic of message type LITE. A message sent to the
parent with the ``__LITE_TOPIC`` property is written once, in a queue of the parent, and
indexed in the lite topic's own queue ``%LMQ%$<parent>$<lite>`` (queue 0), where the
message's offset is its ``INNER_MULTI_QUEUE_OFFSET``. A lite consumer tells each broker
which lite topics it wants (LITE_SUBSCRIPTION_CTL) and pops them together with
POP_LITE_MESSAGE; see ``docs/design.md`` "Lite topics".
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

LMQ_PREFIX = "%LMQ%$"  # LiteUtil.LITE_TOPIC_PREFIX
LMQ_SEPARATOR = "$"


def lmq_name(parent: str, lite_topic: str) -> str:
    """The queue a lite topic's messages are indexed in (LiteUtil.toLmqName)."""
    return f"{LMQ_PREFIX}{parent}{LMQ_SEPARATOR}{lite_topic}"


def split_lmq_name(name: str) -> tuple[str, str] | None:
    """(parent, lite topic) of an LMQ name, or None if it is not one."""
    if not name.startswith(LMQ_PREFIX):
        return None
    parent, sep, lite = name[len(LMQ_PREFIX) :].partition(LMQ_SEPARATOR)
    return (parent, lite) if sep and parent and lite else None


class LiteAction(enum.StrEnum):
    """What a subscription entry does to the client's set of lite topics on a broker
    (LiteSubscriptionAction; the gRPC enum has the same names, 0..3 in this order)."""

    PARTIAL_ADD = "PARTIAL_ADD"  # add these
    PARTIAL_REMOVE = "PARTIAL_REMOVE"  # drop these
    COMPLETE_ADD = "COMPLETE_ADD"  # the set is exactly these (no quota check)
    COMPLETE_REMOVE = "COMPLETE_REMOVE"  # drop the client


class OffsetType(enum.StrEnum):
    """Where a PARTIAL_ADD starts reading a lite topic (OffsetOption.Type)."""

    POLICY = "POLICY"  # value: 0 last (the group's offset), 1 min, 2 max
    OFFSET = "OFFSET"  # value: an offset in the lite queue
    TAIL_N = "TAIL_N"  # value: the last n messages
    TIMESTAMP = "TIMESTAMP"  # value: epoch ms


POLICY_LAST = 0
POLICY_MIN = 1
POLICY_MAX = 2


@dataclass(frozen=True, slots=True)
class OffsetOption:
    type: OffsetType
    value: int

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type.value, "value": self.value}


@dataclass(frozen=True, slots=True)
class LiteSubscription:
    """One entry of a LITE_SUBSCRIPTION_CTL body (LiteSubscriptionDTO)."""

    action: LiteAction
    client_id: str
    group: str
    topic: str  # the parent topic
    lite_topics: tuple[str, ...] = ()
    offset_option: OffsetOption | None = None
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action.value,
            "clientId": self.client_id,
            "group": self.group,
            "topic": self.topic,
            "liteTopicSet": list(self.lite_topics),
            "version": self.version,
        }
        if self.offset_option is not None:
            out["offsetOption"] = self.offset_option.to_json()
        return out

    @classmethod
    def from_json(cls, value: Any) -> LiteSubscription:
        """Raises ValueError naming what is wrong."""
        if not isinstance(value, dict):
            raise ValueError("a lite subscription is not an object")
        try:
            action = LiteAction(str(value.get("action")))
        except ValueError:
            raise ValueError(f"unknown lite subscription action {value.get('action')!r}") from None
        topics = value.get("liteTopicSet") or []
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise ValueError("liteTopicSet is not a list of names")
        option = value.get("offsetOption")
        offset_option = None
        if option is not None:
            if not isinstance(option, dict):
                raise ValueError("offsetOption is not an object")
            try:
                offset_option = OffsetOption(
                    OffsetType(str(option.get("type"))), int(option["value"])
                )
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"bad offsetOption {option!r}") from None
        version = value.get("version", 0)
        if not isinstance(version, int):
            raise ValueError("version is not a number")
        return cls(
            action=action,
            client_id=str(value.get("clientId") or ""),
            group=str(value.get("group") or ""),
            topic=str(value.get("topic") or ""),
            lite_topics=tuple(topics),
            offset_option=offset_option,
            version=version,
        )


@dataclass(frozen=True, slots=True)
class LiteSubscriptionCtlBody:
    """The body of LITE_SUBSCRIPTION_CTL (LiteSubscriptionCtlRequestBody); no header."""

    subscriptions: tuple[LiteSubscription, ...] = field(default_factory=tuple)

    def encode(self) -> bytes:
        return orjson.dumps({"subscriptionSet": [s.to_json() for s in self.subscriptions]})

    @classmethod
    def decode(cls, body: bytes) -> LiteSubscriptionCtlBody:
        """Raises ValueError naming what is wrong."""
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"lite subscription body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("lite subscription body is not an object")
        entries = value.get("subscriptionSet") or []
        if not isinstance(entries, list):
            raise ValueError("subscriptionSet is not a list")
        return cls(tuple(LiteSubscription.from_json(e) for e in entries))


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``: the bucket of ``value`` among
    ``buckets``, moving as few values as possible when the count changes."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    state = value & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        shifted = state >> 33  # < 2**31: (int) keeps it
        next_candidate = int((candidate + 1) / ((shifted + 1) / 2.0**31))
        if 0 <= next_candidate < buckets:
            candidate = next_candidate
        else:
            return candidate


def lite_queue_index(lite_topic: str, queue_count: int) -> int:
    """Which of the parent's write queues a lite topic's messages go to, and so which
    broker owns the lite topic: index into the write queues listed broker by broker
    (brokers by name, each broker's queues 0..n-1), as the 5.5.0 proxy
    (``SendMessageQueueSelector``) and broker (``LiteShardingImpl``) compute it."""
    return consistent_hash(java_string_hash(lite_topic), queue_count)


def lite_owner(lite_topic: str, queue_datas: Sequence[dict[str, Any]]) -> str | None:
    """The broker owning ``lite_topic`` by the parent's route ``queueDatas``: the broker of
    write queue ``lite_queue_index`` among the writable brokers' queues, brokers by name
    (LiteShardingImpl over topicRouteData2TopicPublishInfo); None without a write queue."""
    queues = [
        qd["brokerName"]
        for qd in sorted(queue_datas, key=lambda q: q["brokerName"])
        if int(qd.get("perm", 6)) & 2
        for _ in range(int(qd["writeQueueNums"]))
    ]
    return queues[lite_queue_index(lite_topic, len(queues))] if queues else None
