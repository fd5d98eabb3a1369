"""The stubs behind ``rmq-proxy --embedded-brokers N``, found by the proxy through this
distribution's ``rmq_proxy.embedded_brokers`` entry point (``proxy.embedded``)."""

from __future__ import annotations

from broker_stub.cluster import StubCluster
from broker_stub.config import BrokerConfig


async def start(count: int, topics: list[str]) -> StubCluster:
    """A name server and ``count`` brokers on loopback with ``topics`` on every broker."""
    cluster = StubCluster(count, host="127.0.0.1", template=BrokerConfig(topics=list(topics)))
    await cluster.start()  # stops what it started if it fails
    return cluster
