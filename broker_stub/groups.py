"""Subscription groups of one broker: what UPDATE_AND_CREATE_SUBSCRIPTIONGROUP sets.

A real broker keeps a SubscriptionGroupConfig per consumer group (auto-created with the
defaults on first use). The stub keeps the fields it acts on: ``retryMaxTimes`` decides
when CONSUMER_SEND_MSG_BACK moves a message to ``%DLQ%<group>``; ``consumeMessageOrderly``
makes a FIFO group (GET_SUBSCRIPTIONGROUP_CONFIG tells the proxy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRIORITY_FACTOR_ATTRIBUTE = "priority.factor"


@dataclass
class GroupConfig:
    name: str
    retry_max_times: int = 16
    retry_queue_nums: int = 1
    consume_enable: bool = True
    consume_message_orderly: bool = False  # a FIFO group: its consumers pop orderly
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def priority_factor(self) -> int:
        """``priority.factor`` (0..100, default 100): the share of pops (in percent) that
        take a PRIORITY topic's queues strictly from the highest one down."""
        try:
            factor = int(self.attributes.get(PRIORITY_FACTOR_ATTRIBUTE, "100"))
        except ValueError:
            return 100
        return min(max(factor, 0), 100)

    @classmethod
    def from_json(cls, body: dict[str, Any], default_retry_max_times: int) -> GroupConfig:
        """From a SubscriptionGroupConfig JSON body (missing fields take the defaults)."""
        return cls(
            name=str(body["groupName"]),
            retry_max_times=int(body.get("retryMaxTimes", default_retry_max_times)),
            retry_queue_nums=int(body.get("retryQueueNums", 1)),
            consume_enable=bool(body.get("consumeEnable", True)),
            consume_message_orderly=bool(body.get("consumeMessageOrderly", False)),
            # The broker keeps each attribute without the "+" that marks it as added.
            attributes={
                str(k).removeprefix("+"): str(v)
                for k, v in (body.get("attributes") or {}).items()
                if not str(k).startswith("-")
            },
        )

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

    def put(self, config: GroupConfig) -> None:
        self._groups[config.name] = config

    def names(self) -> list[str]:
        return sorted(self._groups)
