"""Subscription groups of one broker: what UPDATE_AND_CREATE_SUBSCRIPTIONGROUP sets.

A real broker keeps a SubscriptionGroupConfig per consumer group (auto-created with the
defaults on first use). The stub keeps the fields it acts on: ``retryMaxTimes`` decides
when CONSUMER_SEND_MSG_BACK moves a message to ``%DLQ%<group>``; ``consumeMessageOrderly``
makes a FIFO group (GET_SUBSCRIPTIONGROUP_CONFIG tells the proxy); ``attributes`` hold the
lite settings (RocketMQ 5.5 SubscriptionGroupAttributes), set as ``{"+lite.bind.topic": T}``
and kept without the ``+``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Group attributes a RocketMQ 5.5 broker knows; any other key is refused.
LITE_BIND_TOPIC = "lite.bind.topic"  # the LITE parent topic a lite group consumes
LITE_SUB_MODEL = "lite.sub.model"  # Shared (default) or Exclusive: one client per lite topic
LITE_SUB_RESET_OFFSET_EXCLUSIVE = "lite.sub.reset.offset.exclusive"
LITE_SUB_RESET_OFFSET_UNSUBSCRIBE = "lite.sub.reset.offset.unsubscribe"
LITE_SUB_CLIENT_QUOTA = "lite.sub.client.quota"  # checked by the proxy, not the broker
LITE_SUB_CLIENT_MAX_EVENT_CNT = "lite.sub.client.max.event.cnt"
LITE_SUB_WILDCARD = "lite.sub.wildcard"
PRIORITY_FACTOR_ATTRIBUTE = "priority.factor"
KNOWN_ATTRIBUTES = frozenset(
    {
        LITE_BIND_TOPIC,
        LITE_SUB_MODEL,
        LITE_SUB_RESET_OFFSET_EXCLUSIVE,
        LITE_SUB_RESET_OFFSET_UNSUBSCRIBE,
        LITE_SUB_CLIENT_QUOTA,
        LITE_SUB_CLIENT_MAX_EVENT_CNT,
        LITE_SUB_WILDCARD,
        PRIORITY_FACTOR_ATTRIBUTE,
    }
)


def alter_attributes(current: dict[str, str], changes: dict[str, Any]) -> dict[str, str]:
    """Apply ``{"+key": value, "-key": ...}`` to ``current`` as AttributeUtil does; raises
    ValueError naming a key that is malformed, unknown or deleted while absent."""
    out = dict(current)
    for raw, value in changes.items():
        key = raw[1:]
        if raw[:1] not in ("+", "-") or not key:
            raise ValueError(f"kv string format wrong. key: {raw}")
        if key not in KNOWN_ATTRIBUTES:
            raise ValueError(f"unsupported key: {key}")
        if raw[0] == "+":
            out[key] = str(value)
        elif out.pop(key, None) is None:
            raise ValueError(f"attempt to delete a nonexistent key: {key}")
    return out


@dataclass
class GroupConfig:
    name: str
    retry_max_times: int = 16
    retry_queue_nums: int = 1
    consume_enable: bool = True
    consume_message_orderly: bool = False  # a FIFO group: its consumers pop orderly
    attributes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(
        cls,
        body: dict[str, Any],
        default_retry_max_times: int,
        current: dict[str, str] | None = None,
    ) -> GroupConfig:
        """From a SubscriptionGroupConfig JSON body (missing fields take the defaults), its
        attribute changes applied to ``current`` (raises ValueError on a bad one)."""
        return cls(
            name=str(body["groupName"]),
            retry_max_times=int(body.get("retryMaxTimes", default_retry_max_times)),
            retry_queue_nums=int(body.get("retryQueueNums", 1)),
            consume_enable=bool(body.get("consumeEnable", True)),
            consume_message_orderly=bool(body.get("consumeMessageOrderly", False)),
            attributes=alter_attributes(current or {}, dict(body.get("attributes") or {})),
        )

    @property
    def priority_factor(self) -> int:
        """``priority.factor`` (0..100, default 100): the share of pops (in percent) that
        take a PRIORITY topic's queues strictly from the highest one down."""
        try:
            factor = int(self.attributes.get(PRIORITY_FACTOR_ATTRIBUTE, "100"))
        except ValueError:
            return 100
        return min(max(factor, 0), 100)

    @property
    def lite_bind_topic(self) -> str | None:
        return self.attributes.get(LITE_BIND_TOPIC)

    @property
    def lite_exclusive(self) -> bool:
        return self.attributes.get(LITE_SUB_MODEL) == "Exclusive"

    def flag(self, key: str) -> bool:
        return self.attributes.get(key, "false").lower() == "true"

    def to_json(self) -> dict[str, Any]:
        """As a broker answers GET_SUBSCRIPTIONGROUP_CONFIG (the fields the stub keeps)."""
        return {
            "groupName": self.name,
            "consumeEnable": self.consume_enable,
            "consumeMessageOrderly": self.consume_message_orderly,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "attributes": dict(self.attributes),
        }


class GroupTable:
    def __init__(self, default_retry_max_times: int) -> None:
        self.default_retry_max_times = default_retry_max_times
        self._groups: dict[str, GroupConfig] = {}

    def get(self, name: str) -> GroupConfig:
        """The group's config; a group never configured gets the defaults, as a broker
        with autoCreateSubscriptionGroup does."""
        config = self._groups.get(name)
        if config is None:
            config = self._groups[name] = GroupConfig(name, self.default_retry_max_times)
        return config

    def find(self, name: str) -> GroupConfig | None:
        """The group's config if it was configured or used."""
        return self._groups.get(name)

    def put(self, config: GroupConfig) -> None:
        self._groups[config.name] = config

    def all(self) -> list[GroupConfig]:
        return list(self._groups.values())

    def names(self) -> list[str]:
        return sorted(self._groups)
