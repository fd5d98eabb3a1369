"""Subscription groups of one broker: what UPDATE_AND_CREATE_SUBSCRIPTIONGROUP sets.

A real broker keeps a SubscriptionGroupConfig per consumer group (auto-created with the
defaults on first use). The stub keeps the fields it acts on: ``retryMaxTimes`` decides
when CONSUMER_SEND_MSG_BACK moves a message to ``%DLQ%<group>``; ``consumeMessageOrderly``
makes a FIFO group (GET_SUBSCRIPTIONGROUP_CONFIG tells the proxy); ``attributes`` hold the
lite settings (RocketMQ 5.5 SubscriptionGroupAttributes), set as ``{"+lite.bind.topic": T}``
and kept without the ``+``; ``groupRetryPolicy`` (the back-off between a consumer's
deliveries, which the proxy reads) is kept and answered as a 5.5.0 broker keeps it
(``retry_policy_from_json``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from proxy.remoting.codes import DEFAULT_EXPONENTIAL_BACKOFF, DEFAULT_RETRY_BACKOFF_MS

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


# GroupRetryPolicy of RocketMQ 5.5.0: its type, and the defaults a broker fills in.
RETRY_POLICY_TYPES = ("CUSTOMIZED", "EXPONENTIAL")
# What a broker answers for a group that never set groupRetryPolicy (or set it without
# fields): the type alone. The delays it then applies are DEFAULT_RETRY_BACKOFF_MS.
DEFAULT_RETRY_POLICY: dict[str, Any] = {"type": "CUSTOMIZED"}


def retry_policy_from_json(policy: Any) -> dict[str, Any] | None:
    """A ``groupRetryPolicy`` as a 5.5.0 broker keeps and answers it (bound to its
    GroupRetryPolicy class): ``type`` read case-insensitively, CUSTOMIZED when missing and
    dropped when unknown; an ``exponentialRetryPolicy`` given gets the defaults of the
    fields it lacks (DEFAULT_EXPONENTIAL_BACKOFF); a ``customizedRetryPolicy`` given without
    ``next`` gets DEFAULT_RETRY_BACKOFF_MS; numbers given as text or decimals become
    integers; other fields are dropped. None (a JSON null) is kept: the broker then answers
    no groupRetryPolicy at all. Raises TypeError on a value that is not of its kind."""
    if policy is None:
        return None
    if not isinstance(policy, dict):
        raise TypeError(f"groupRetryPolicy {policy!r} is not an object")
    kept: dict[str, Any] = {}
    kind = policy.get("type", DEFAULT_RETRY_POLICY["type"])
    if isinstance(kind, str) and kind.upper() in RETRY_POLICY_TYPES:
        kept["type"] = kind.upper()
    exponential = policy.get("exponentialRetryPolicy")
    if exponential is not None:
        if not isinstance(exponential, dict):
            raise TypeError(f"exponentialRetryPolicy {exponential!r} is not an object")
        kept["exponentialRetryPolicy"] = {
            key: _json_integer(exponential.get(key, default))
            for key, default in DEFAULT_EXPONENTIAL_BACKOFF.items()
        }
    customized = policy.get("customizedRetryPolicy")
    if customized is not None:
        if not isinstance(customized, dict):
            raise TypeError(f"customizedRetryPolicy {customized!r} is not an object")
        steps = customized.get("next", DEFAULT_RETRY_BACKOFF_MS)
        if not isinstance(steps, list | tuple):
            raise TypeError(f"customizedRetryPolicy.next {steps!r} is not a list")
        kept["customizedRetryPolicy"] = {"next": [_json_integer(step) for step in steps]}
    return kept


def _json_integer(value: Any) -> int:
    """A Java int or long field bound from JSON: an integer, a decimal (truncated) or the
    text of an integer."""
    if isinstance(value, bool):
        raise TypeError(f"{value!r} is not a number")
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise TypeError(f"{value!r} is not a number") from None
    raise TypeError(f"{value!r} is not a number")


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
    # groupRetryPolicy as kept (retry_policy_from_json); None: set to null, answered absent
    retry_policy: dict[str, Any] | None = field(default_factory=lambda: dict(DEFAULT_RETRY_POLICY))

    @classmethod
    def from_json(
        cls,
        body: dict[str, Any],
        default_retry_max_times: int,
        current: dict[str, str] | None = None,
    ) -> GroupConfig:
        """From a SubscriptionGroupConfig JSON body (missing fields take the defaults), its
        attribute changes applied to ``current`` (raises ValueError on a bad one). A body
        without ``groupRetryPolicy`` sets the default one, as a broker replaces the whole
        config (attributes aside)."""
        policy = body.get("groupRetryPolicy", DEFAULT_RETRY_POLICY)
        return cls(
            name=str(body["groupName"]),
            retry_max_times=int(body.get("retryMaxTimes", default_retry_max_times)),
            retry_queue_nums=int(body.get("retryQueueNums", 1)),
            consume_enable=bool(body.get("consumeEnable", True)),
            consume_message_orderly=bool(body.get("consumeMessageOrderly", False)),
            attributes=alter_attributes(current or {}, dict(body.get("attributes") or {})),
            retry_policy=retry_policy_from_json(policy),
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
        answer: dict[str, Any] = {
            "groupName": self.name,
            "consumeEnable": self.consume_enable,
            "consumeMessageOrderly": self.consume_message_orderly,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "attributes": dict(self.attributes),
        }
        if self.retry_policy is not None:
            answer["groupRetryPolicy"] = copy.deepcopy(self.retry_policy)
        return answer


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
