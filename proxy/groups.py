"""Consumer-group settings the proxy acts on, read from the brokers and cached.

A group is FIFO when its SubscriptionGroupConfig says ``consumeMessageOrderly``: its
consumers are told so in their Telemetry settings (``subscription.fifo``) and every pop and
probe for it is orderly. The Apache proxy reads the same flag the same way (its
``MetadataService``). The answer is cached for ``ttl_s``, as routes are; concurrent look-ups
of one group share a request; the cache holds at most ``max_groups`` groups (oldest out).
A group the broker cannot tell about is taken as not FIFO and asked again next time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from proxy.background import shared_lookup
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)


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
        self._cache: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[bool]] = {}

    def known_fifo(self, group: str) -> bool | None:
        """The cached answer, or None when it is not (or no longer) cached."""
        cached = self._cache.get(group)
        if cached is None or time.monotonic() - cached[0] >= self.ttl_s:
            return None
        return cached[1]

    async def fifo(self, group: str, topic: str) -> bool:
        """Whether ``group`` consumes orderly; asks a broker serving ``topic`` if need be."""
        known = self.known_fifo(group)
        if known is not None:
            return known
        return await shared_lookup(self._pending, group, lambda: self._fetch(group, topic))

    async def _fetch(self, group: str, topic: str) -> bool:
        try:
            route = await self.pool.route(topic)
            for broker in route.readable:
                client = self.pool.broker(broker.name)
                if client is None:
                    continue
                try:
                    config = await client.group_config(group, timeout=self.timeout_s)
                except RemotingError as exc:
                    log.info("group config of %s from %s: %s", group, broker.name, exc)
                    continue
                fifo = bool(config.get("consumeMessageOrderly", False))
                self._remember(group, fifo)
                return fifo
        except (TopicNotFound, RemotingError) as exc:
            log.info("group config of %s: no route for %s: %s", group, topic, exc)
        return False  # not cached: asked again on the next request

    def _remember(self, group: str, fifo: bool) -> None:
        self._cache[group] = (time.monotonic(), fifo)
        self._cache.move_to_end(group)
        while len(self._cache) > self.max_groups:
            self._cache.popitem(last=False)
