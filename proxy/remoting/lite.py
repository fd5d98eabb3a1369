"""Lite topics (RocketMQ 5.5, RIP-83) on the wire: LMQ names, the LITE_SUBSCRIPTION_CTL body,
and which queue (so which broker) owns a lite topic.

A lite topic lives under a parent topic of message type LITE. A message sent to the parent
with the ``__LITE_TOPIC`` property is stored once, in a parent queue, and indexed again in
the lite topic's own queue, a *light message queue* (LMQ) named ``%LMQ%$<parent>$<lite>``
with a single queue 0. A lite topic belongs to one broker: the one whose queue the parent
topic's route puts at ``consistentHash(liteTopic.hashCode(), queue count)`` (Guava's
consistent hash; a 5.5 broker's LiteShardingImpl and a 5.5 proxy's send both use it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

LITE_TOPIC_PREFIX = "%LMQ%$"
SEPARATOR = "$"


def lmq_name(parent: str, lite_topic: str) -> str:
    """The LMQ of ``lite_topic`` under ``parent`` (LiteUtil.toLmqName)."""
    return f"{LITE_TOPIC_PREFIX}{parent}{SEPARATOR}{lite_topic}"


def split_lmq(name: str) -> tuple[str, str] | None:
    """(parent, lite topic) of an LMQ name, or None if ``name`` is not one."""
    if not name.startswith(LITE_TOPIC_PREFIX):
        return None
    parent, sep, lite = name[len(LITE_TOPIC_PREFIX) :].partition(SEPARATOR)
    if not sep or not parent or not lite:
        return None
    return parent, lite


class LiteSubscriptionAction(Enum):
    PARTIAL_ADD = "PARTIAL_ADD"
    PARTIAL_REMOVE = "PARTIAL_REMOVE"
    COMPLETE_ADD = "COMPLETE_ADD"
    COMPLETE_REMOVE = "COMPLETE_REMOVE"


class OffsetType(Enum):
    """OffsetOption.Type: where a newly subscribed lite topic starts."""

    POLICY = "POLICY"  # value: 0 last (keep), 1 min, 2 max
    OFFSET = "OFFSET"
    TAIL_N = "TAIL_N"  # the current offset minus value
    TIMESTAMP = "TIMESTAMP"  # accepted and ignored by a 5.5 broker


POLICY_LAST = 0
POLICY_MIN = 1
POLICY_MAX = 2


@dataclass(frozen=True, slots=True)
class OffsetOption:
    type: OffsetType
    value: int = 0


@dataclass(slots=True)
class LiteSubscriptionEntry:
    """One LiteSubscriptionDTO of a LITE_SUBSCRIPTION_CTL body."""

    action: LiteSubscriptionAction
    client_id: str
    group: str
    topic: str  # the parent topic
    lite_topics: set[str] = field(default_factory=set)
    offset_option: OffsetOption | None = None
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action.value,
            "clientId": self.client_id,
            "group": self.group,
            "liteTopicSet": sorted(self.lite_topics),
            "topic": self.topic,
            "version": self.version,
        }
        if self.offset_option is not None:
            out["offsetOption"] = {
                "type": self.offset_option.type.value,
                "value": self.offset_option.value,
            }
        return out

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LiteSubscriptionEntry:
        """Raises KeyError, ValueError or TypeError on a malformed entry."""
        option = body.get("offsetOption")
        return cls(
            action=LiteSubscriptionAction(body["action"]),
            client_id=str(body.get("clientId") or ""),
            group=str(body.get("group") or ""),
            topic=str(body.get("topic") or ""),
            lite_topics={str(t) for t in body.get("liteTopicSet") or ()},
            offset_option=(
                OffsetOption(OffsetType(option["type"]), int(option.get("value", 0)))
                if option
                else None
            ),
            version=int(body.get("version") or 0),
        )


def ctl_body(entries: Iterable[LiteSubscriptionEntry]) -> dict[str, Any]:
    """A LiteSubscriptionCtlRequestBody."""
    return {"subscriptionSet": [e.to_json() for e in entries]}


# -- sharding -----------------------------------------------------------------------------


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` (over UTF-16 code units, 32-bit signed)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    state = value & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        next_double = ((state >> 33) + 1) / 2**31
        quotient = (candidate + 1) / next_double
        nxt = min(int(quotient), 2**31 - 1)  # Java's (int) cast saturates
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


def owner_index(lite_topic: str, queue_count: int) -> int:
    """Index of the queue that owns ``lite_topic`` among ``queue_count`` write queues."""
    return consistent_hash(java_string_hash(lite_topic), queue_count)


def publish_queues(queue_datas: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
    """(broker name, queue id) of a route's write queues in the order a RocketMQ client lists
    them (topicRouteData2TopicPublishInfo): by broker name, each writable broker's
    writeQueueNums queues."""
    out: list[tuple[str, int]] = []
    for qd in sorted(queue_datas, key=lambda q: q["brokerName"]):
        if int(qd.get("perm", 6)) & 2:
            out.extend((qd["brokerName"], i) for i in range(int(qd["writeQueueNums"])))
    return out


def owner_broker(lite_topic: str, queue_datas: Sequence[dict[str, Any]]) -> str | None:
    """The broker owning ``lite_topic`` by the parent topic's route; None if it has no
    write queue."""
    queues = publish_queues(queue_datas)
    if not queues:
        return None
    return queues[owner_index(lite_topic, len(queues))][0]
