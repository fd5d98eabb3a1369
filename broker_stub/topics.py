"""Topic configurations of one broker, and the name rules RocketMQ enforces."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.remoting.popinfo import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
PERM_READ_WRITE = PERM_READ | PERM_WRITE

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
DEFAULT_TOPIC = "TBW102"
_NAME = re.compile(r"^[%|a-zA-Z0-9_+-]+$")


def topic_name_error(topic: str) -> str | None:
    """Why ``topic`` is not a valid topic name, or None if it is."""
    if not topic or not topic.strip():
        return "the topic is blank"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"the topic is longer than {TOPIC_MAX_LENGTH} characters"
    if not _NAME.match(topic):
        return f"the topic [{topic}] contains illegal characters, allowed: ^[%|a-zA-Z0-9_-]+$"
    return None


def group_name_error(group: str) -> str | None:
    """Why ``group`` is not a valid consumer group name, or None if it is."""
    if not group or not group.strip():
        return "the consumer group is blank"
    if len(group) > GROUP_MAX_LENGTH:
        return f"the consumer group is longer than {GROUP_MAX_LENGTH} characters"
    if not _NAME.match(group):
        return f"the consumer group [{group}] contains illegal characters"
    return None


MESSAGE_TYPE_ATTRIBUTE = "message.type"


def alter_attributes(current: dict[str, str], change: str | None) -> dict[str, str]:
    """``current`` with UPDATE_AND_CREATE_TOPIC's ``attributes`` applied: comma-separated
    ``+name=value`` (set) and ``-name`` (remove), as the broker's AttributeUtil reads them."""
    attributes = dict(current)
    for item in (change or "").split(","):
        item = item.strip()
        if item.startswith("+") and "=" in item:
            name, _, value = item[1:].partition("=")
            attributes[name] = value
        elif item.startswith("-"):
            attributes.pop(item[1:], None)
        elif item:
            raise ValueError(f"attribute {item!r} is neither +name=value nor -name")
    return attributes


@dataclass
class TopicConfig:
    name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def message_type(self) -> str:
        """The ``message.type`` attribute: NORMAL when unset, as TopicConfig has it."""
        return self.attributes.get(MESSAGE_TYPE_ATTRIBUTE) or "NORMAL"

    def to_json(self) -> dict[str, object]:
        return {
            "attributes": dict(self.attributes),
            "order": False,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": "SINGLE_TAG",
            "topicName": self.name,
            "topicSysFlag": 0,
            "writeQueueNums": self.write_queue_nums,
        }


class TopicTable:
    """The broker's topics. ``on_change`` fires when one is created (to re-register)."""

    def __init__(
        self, default_queue_nums: int, on_change: Callable[[], None] | None = None
    ) -> None:
        self.default_queue_nums = default_queue_nums
        self.on_change = on_change
        self._topics: dict[str, TopicConfig] = {
            DEFAULT_TOPIC: TopicConfig(
                DEFAULT_TOPIC,
                default_queue_nums,
                default_queue_nums,
                PERM_READ_WRITE | PERM_INHERIT,
            )
        }
        self.version = 1

    def get(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def all(self) -> list[TopicConfig]:
        return list(self._topics.values())

    def create(
        self,
        name: str,
        queue_nums: int | None = None,
        perm: int = PERM_READ_WRITE,
        write_queue_nums: int | None = None,
        attributes: dict[str, str] | None = None,
    ) -> TopicConfig:
        """Create (or update the queue counts and attributes of) a topic; ``attributes``
        None keeps the current ones."""
        nums = queue_nums or self.default_queue_nums
        write_nums = write_queue_nums or nums
        config = self._topics.get(name)
        if attributes is None:
            attributes = config.attributes if config is not None else {}
        if config is None or (
            config.read_queue_nums,
            config.write_queue_nums,
            config.perm,
            config.attributes,
        ) != (nums, write_nums, perm, attributes):
            config = self._topics[name] = TopicConfig(name, nums, write_nums, perm, attributes)
            self.version += 1
            if self.on_change is not None:
                self.on_change()
        return config

    def system_topic(self, name: str) -> TopicConfig:
        """A retry or dead-letter topic: one queue, created on first use."""
        assert name.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
        return self._topics.get(name) or self.create(name, 1)
