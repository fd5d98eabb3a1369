"""How far each consumer group is behind, per topic, on ``/metrics``: for autoscalers (a
KEDA ScaledObject, an HPA on an external metric) and alerts.

For every (group, topic) of a consumer registered on this proxy (``Registrations``), every
``refresh_s`` the proxy asks each broker of the topic for the group's consume stats
(GET_CONSUME_STATS, what ``mqadmin consumerProgress`` asks) and publishes the sum over the
topic's queues of the broker's offset minus the group's: the messages not yet consumed,
POP consumers included. That is ``consumerProgress``'s "Diff Total" for the topic, read
the same way. Where a broker says the group is behind, it is also asked the age of the
oldest message not consumed (QUERY_CONSUME_TIME_SPAN: per queue, now minus the store time
of the message at the group's offset); the largest is published.

What it costs the brokers: one GET_CONSUME_STATS per (group, topic, broker) per
``refresh_s`` from each proxy with a consumer of the group, and one QUERY_CONSUME_TIME_SPAN
more where the group is behind; only pairs with a consumer on
the proxy are asked about, and a pair whose consumers all left is dropped from
``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.background import start_background, stop_background
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.observability.log_every import LogEvery
from proxy.observability.metrics import ProxyMetrics
from proxy.remoting.answers import consume_lag, oldest_unconsumed_ms
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)

REFRESH_LOG_EVERY_S = 300.0

Pair = tuple[str, str]  # (group, topic)


@dataclass(frozen=True, slots=True)
class Lag:
    """How far a group is behind on a topic."""

    messages: int  # not yet consumed
    oldest_s: float  # the oldest of them: its age (0: none)


class GroupLag:
    """Owns the refresh task (``start``, ``close``)."""

    def __init__(
        self,
        pool: BrokerPool,
        metrics: ProxyMetrics,
        pairs: Callable[[], set[Pair]],
        *,
        refresh_s: float,
        timeout_s: float = 3.0,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.pairs = pairs
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.lag: dict[Pair, Lag] = {}
        self.refreshes = 0
        self._task: asyncio.Task[None] | None = None
        self._failures = LogEvery(log, REFRESH_LOG_EVERY_S)

    def start(self) -> None:
        self._task = start_background(self._run(), name="group-lag", log=log)

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_background(task)

    def status(self) -> dict[str, int]:
        return {"pairs": len(self.lag), "refreshes": self.refreshes}

    async def _run(self) -> None:
        next_refresh = time.monotonic()
        while True:
            try:
                await self.refresh_once()
            except Exception as exc:  # a bug of a round must not end every later one
                self._failures.warning("consumer lag: a refresh failed: %r", exc)
            next_refresh += self.refresh_s  # a fixed pace, whatever a refresh takes
            await asyncio.sleep(max(0.0, next_refresh - time.monotonic()))

    async def refresh_once(self) -> None:
        """Ask the brokers about every pair with a consumer here; drop the others. A pair
        whose lag cannot be read (a broker's error, or an answer that does not parse: a
        queue without its offsets) keeps its last value this round, with a warning at most
        every ``REFRESH_LOG_EVERY_S``; the other pairs, and the later rounds, go on."""
        wanted = self.pairs()
        for pair in sorted(wanted):
            try:
                lag = await self._lag(*pair)
            except _Unknown:
                continue
            except Exception as exc:  # an answer not as documented: this pair, this round
                self._failures.warning("consumer lag of %s on %s: %r", *pair, exc)
                continue
            self.lag[pair] = lag
            self.metrics.set_consumer_lag(*pair, lag.messages, lag.oldest_s)
        for pair in set(self.lag) - wanted:
            del self.lag[pair]
            self.metrics.forget_consumer_lag(*pair)
        self.metrics.publish_live_gauges()  # with workers: the round, whole, to the supervisor
        self.refreshes += 1

    async def _lag(self, group: str, topic: str) -> Lag:
        """Messages not consumed, and the oldest one's age in seconds (asked only of the
        brokers where the group is behind)."""
        try:
            route = await self.pool.route(topic)
        except (TopicNotFound, RemotingError) as exc:
            raise _Unknown from exc
        total, oldest_ms = 0, 0
        for broker in route.brokers:
            client = self.pool.broker(broker.name)
            if client is None:
                raise _Unknown
            try:
                behind = consume_lag(await client.consume_stats(group, topic, self.timeout_s))
                if behind > 0:
                    spans = await client.consume_time_span(group, topic, self.timeout_s)
                    oldest_ms = max(oldest_ms, oldest_unconsumed_ms(spans))
            except RemotingError as exc:
                self._failures.warning(
                    "consumer lag of %s on %s from %s: %s", group, topic, broker.name, exc
                )
                raise _Unknown from exc
            total += behind
        return Lag(total, oldest_ms / 1000)


class _Unknown(Exception):
    """A pair's lag could not be read this round (its last value stays)."""
