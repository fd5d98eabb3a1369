"""Consumer-group settings the proxy acts on, read from the brokers and cached.

A group is FIFO when its SubscriptionGroupConfig says ``consumeMessageOrderly``: its
consumers are told so in their Telemetry settings (``subscription.fifo``) and every pop and
probe for it is orderly. The Apache proxy reads the same flag the same way (its
``MetadataService``). A group is a lite group of a parent topic when its attribute
``lite.bind.topic`` names it (RocketMQ 5.5): its polls of that topic are lite pops, and its
consumers' settings carry the group's ``lite.sub.client.quota``. The answer is cached for
``ttl_s``, as routes are; concurrent look-ups of one group share a request; the cache holds
at most ``max_groups`` groups (oldest out). A group the broker cannot tell about is taken
as neither FIFO nor lite and asked again next time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from proxy.background import shared_lookup
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)

# SubscriptionGroupAttributes.LITE_SUB_CLIENT_QUOTA_ATTRIBUTE's default (5.5.0).
DEFAULT_LITE_QUOTA = 2000


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """What the proxy uses of a SubscriptionGroupConfig."""

    fifo: bool = False
    lite_bind_topic: str | None = None  # attribute lite.bind.topic
    lite_quota: int = DEFAULT_LITE_QUOTA  # attribute lite.sub.client.quota

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
        )


_UNKNOWN = GroupConfig()


class GroupSettings:
    def __init__(
        self,
        pool: BrokerPool,
        *,
        ttl_s: float = 30.0,
        max_groups: int = 10_000,
        timeout_s: float = 3.0,
    ) -> None:
        self.pool = pool
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
        return _UNKNOWN  # not cached: asked again on the next request

    def _remember(self, group: str, config: GroupConfig) -> None:
        self._cache[group] = (time.monotonic(), config)
        self._cache.move_to_end(group)
        while len(self._cache) > self.max_groups:
            self._cache.popitem(last=False)
