"""Consumer-group settings the proxy acts on, read from the brokers and cached.

A group's retry policy is its ``retryMaxTimes`` and ``groupRetryPolicy`` (set with
``mqadmin updateSubGroup``): its consumers are told it in their Telemetry settings
(``backoff_policy``: 1 + retryMaxTimes attempts, and the back-off between them), and a
message popped for it past its last attempt goes to ``%DLQ%<group>`` instead of the
client. The Apache proxy answers and cuts by the same fields.

A group is FIFO when its SubscriptionGroupConfig says ``consumeMessageOrderly``: its
consumers are told so in their Telemetry settings (``subscription.fifo``) and every pop and
probe for it is orderly. The Apache proxy reads the same flag the same way (its
``MetadataService``). A group is a lite group of a parent topic when its attribute
``lite.bind.topic`` names it (RocketMQ 5.5): its polls of that topic are lite pops, and its
consumers' settings carry the group's ``lite.sub.client.quota``. The answer is cached for
``ttl_s``, as routes are; concurrent look-ups of one group share a request; the cache holds
at most ``max_groups`` groups (oldest out). A group the broker cannot tell about is taken
as neither FIFO nor lite, with the retry policy's defaults (``unknown_max_attempts``
attempts), and asked again next time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from proxy.background import shared_lookup
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import DEFAULT_EXPONENTIAL_BACKOFF, DEFAULT_RETRY_BACKOFF_MS

log = logging.getLogger(__name__)

# SubscriptionGroupAttributes.LITE_SUB_CLIENT_QUOTA_ATTRIBUTE's default (5.5.0).
DEFAULT_LITE_QUOTA = 2000


# A group's retries when it sets none: RocketMQ 5.5.0's default (its back-off: codes.py).
DEFAULT_RETRY_MAX_TIMES = 16
_EXPONENTIAL = DEFAULT_EXPONENTIAL_BACKOFF


class BackoffKind(StrEnum):
    """GroupRetryPolicyType: a list of delays, or delays that grow by a factor."""

    CUSTOMIZED = "CUSTOMIZED"
    EXPONENTIAL = "EXPONENTIAL"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A group's deliveries and the back-off between them."""

    max_attempts: int = DEFAULT_RETRY_MAX_TIMES + 1  # 1 + retryMaxTimes
    kind: BackoffKind = BackoffKind.CUSTOMIZED
    next_ms: tuple[int, ...] = DEFAULT_RETRY_BACKOFF_MS  # CUSTOMIZED: the n-th retry's delay
    initial_ms: int = _EXPONENTIAL["initial"]  # EXPONENTIAL: initial * multiplier^n, to max
    max_ms: int = _EXPONENTIAL["max"]
    multiplier: int = _EXPONENTIAL["multiplier"]

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> RetryPolicy:
        """From a SubscriptionGroupConfig; a field missing or unreadable is its default."""
        retries = _int(config.get("retryMaxTimes"), DEFAULT_RETRY_MAX_TIMES)
        policy = config.get("groupRetryPolicy")
        policy = policy if isinstance(policy, dict) else {}
        kind = BackoffKind.CUSTOMIZED
        if str(policy.get("type", "")).upper() == BackoffKind.EXPONENTIAL.value:
            kind = BackoffKind.EXPONENTIAL
        customized = policy.get("customizedRetryPolicy")
        steps = customized.get("next") if isinstance(customized, dict) else None
        next_ms = DEFAULT_RETRY_BACKOFF_MS
        if isinstance(steps, list):
            next_ms = tuple(_int(step, 0) for step in steps)
        exponential = policy.get("exponentialRetryPolicy")
        exponential = exponential if isinstance(exponential, dict) else {}
        return cls(
            # An int32 in the settings, as the Apache proxy's.
            max_attempts=max(0, min(retries + 1, 2**31 - 1)),
            kind=kind,
            next_ms=next_ms,
            initial_ms=_int(exponential.get("initial"), _EXPONENTIAL["initial"]),
            max_ms=_int(exponential.get("max"), _EXPONENTIAL["max"]),
            multiplier=_int(exponential.get("multiplier"), _EXPONENTIAL["multiplier"]),
        )


def _int(value: object, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return default
    try:
        return int(value)
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """What the proxy uses of a SubscriptionGroupConfig."""

    fifo: bool = False
    lite_bind_topic: str | None = None  # attribute lite.bind.topic
    lite_quota: int = DEFAULT_LITE_QUOTA  # attribute lite.sub.client.quota
    retry: RetryPolicy = RetryPolicy()

    def is_lite(self, topic: str) -> bool:
        """Whether the group consumes ``topic`` as its lite parent topic."""
        return self.lite_bind_topic is not None and self.lite_bind_topic == topic

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> GroupConfig:
        attributes = config.get("attributes")
        if not isinstance(attributes, dict):
            attributes = {}
        bind = attributes.get("lite.bind.topic")
        try:
            quota = int(attributes.get("lite.sub.client.quota", DEFAULT_LITE_QUOTA))
        except (TypeError, ValueError):
            quota = DEFAULT_LITE_QUOTA
        return cls(
            fifo=bool(config.get("consumeMessageOrderly", False)),
            lite_bind_topic=str(bind) if bind else None,
            # The settings field is an int32, as the Apache proxy's Math.toIntExact.
            lite_quota=max(-1, min(quota, 2**31 - 1)),
            retry=RetryPolicy.from_json(config),
        )


class GroupSettings:
    def __init__(
        self,
        pool: BrokerPool,
        *,
        ttl_s: float = 30.0,
        max_groups: int = 10_000,
        timeout_s: float = 3.0,
        unknown_max_attempts: int = DEFAULT_RETRY_MAX_TIMES + 1,
    ) -> None:
        """``unknown_max_attempts``: the attempts of a group no broker could tell about."""
        self.pool = pool
        self._unknown = GroupConfig(retry=RetryPolicy(max_attempts=unknown_max_attempts))
        self.ttl_s = ttl_s
        self.max_groups = max_groups
        self.timeout_s = timeout_s
        self._cache: OrderedDict[str, tuple[float, GroupConfig]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[GroupConfig]] = {}

    def known(self, group: str) -> GroupConfig | None:
        """The cached config, or None when it is not (or no longer) cached."""
        cached = self._cache.get(group)
        if cached is None or time.monotonic() - cached[0] >= self.ttl_s:
            return None
        return cached[1]

    def known_fifo(self, group: str) -> bool | None:
        """The cached answer, or None when it is not (or no longer) cached."""
        known = self.known(group)
        return None if known is None else known.fifo

    async def config(self, group: str, topic: str | None) -> GroupConfig:
        """The group's config; asks a broker serving ``topic`` if need be (without a topic:
        any broker this proxy knows; a group lives on every broker)."""
        known = self.known(group)
        if known is not None:
            return known
        return await shared_lookup(self._pending, group, lambda: self._fetch(group, topic))

    async def fifo(self, group: str, topic: str) -> bool:
        """Whether ``group`` consumes orderly; asks a broker serving ``topic`` if need be."""
        return (await self.config(group, topic)).fifo

    async def _fetch(self, group: str, topic: str | None) -> GroupConfig:
        try:
            if topic is None:
                names = list(self.pool.brokers)
            else:
                names = [b.name for b in (await self.pool.route(topic)).readable]
            for name in names:
                client = self.pool.broker(name)
                if client is None:
                    continue
                try:
                    config = await client.group_config(group, timeout=self.timeout_s)
                except RemotingError as exc:
                    log.info("group config of %s from %s: %s", group, name, exc)
                    continue
                found = GroupConfig.from_json(config)
                self._remember(group, found)
                return found
        except (TopicNotFound, RemotingError) as exc:
            log.info("group config of %s: no route for %s: %s", group, topic, exc)
        return self._unknown  # not cached: asked again on the next request

    def _remember(self, group: str, config: GroupConfig) -> None:
        self._cache[group] = (time.monotonic(), config)
        self._cache.move_to_end(group)
        while len(self._cache) > self.max_groups:
            self._cache.popitem(last=False)
