"""GroupLag's refresh against fake brokers: an answer that does not parse costs its pair
that round, never the task (the lag of the brokers' real answers: tests/integration)."""

from __future__ import annotations

import logging
from typing import Any, cast

from proxy.brokers import BrokerPool, BrokerRoute, TopicRoute
from proxy.observability.lag import GroupLag
from proxy.observability.metrics import ProxyMetrics
from testkit.metrics_text import samples
from testkit.waits import wait_until


def _stats(behind: int) -> dict[str, Any]:
    return {"offsetTable": {("q", 0): {"brokerOffset": behind, "consumerOffset": 0}}}


class _Broker:
    """Answers the consume stats of ``answers[group]``; the first ``bad_rounds`` rounds of
    group "Bad" get a queue without its offsets (a KeyError when read)."""

    def __init__(self, bad_rounds: int) -> None:
        self.bad_rounds = bad_rounds
        self.asked: dict[str, int] = {}

    async def consume_stats(self, group: str, topic: str, timeout: float) -> dict[str, Any]:
        n = self.asked[group] = self.asked.get(group, 0) + 1
        if group == "Bad" and n <= self.bad_rounds:
            return {"offsetTable": {("q", 0): {"consumerOffset": 0}}}  # no brokerOffset
        return _stats(5 if group == "Bad" else 2)

    async def consume_time_span(self, group: str, topic: str, timeout: float) -> dict[str, Any]:
        return {"consumeTimeSpanSet": [{"delayTime": 1500}]}


class _Pool:
    def __init__(self, broker: _Broker) -> None:
        self.client = broker

    async def route(self, topic: str) -> TopicRoute:
        return TopicRoute(topic, (BrokerRoute("b", "127.0.0.1:1", 1, 1, 6),))

    def broker(self, name: str) -> _Broker:
        return self.client


def _lag(metrics: ProxyMetrics, group: str) -> list[float]:
    found = samples(metrics.render()[0], "rocketmq_proxy_consumer_lag_messages")
    return [v for labels, v in found if labels["group"] == group]


async def test_an_answer_that_does_not_parse_costs_its_pair_that_round_only(caplog):
    broker = _Broker(bad_rounds=3)
    metrics = ProxyMetrics()
    lag = GroupLag(
        cast(BrokerPool, _Pool(broker)),
        metrics,
        lambda: {("Bad", "T"), ("Good", "T")},
        refresh_s=0.01,
    )
    caplog.set_level(logging.WARNING, logger="proxy.observability.lag")
    lag.start()
    try:
        # The rounds go on past the bad answers, and the bad pair is read once they stop.
        await wait_until(lambda: lag.refreshes >= 5, timeout=5, what="five refreshes")
        assert _lag(metrics, "Good") == [2.0]
        await wait_until(lambda: _lag(metrics, "Bad") == [5.0], timeout=5)
    finally:
        await lag.close()
    lines = [m for r in caplog.records if "consumer lag of Bad on T" in (m := r.getMessage())]
    assert len(lines) == 1, lines  # one line for the three bad answers (throttled)
    assert "KeyError" in lines[0]
