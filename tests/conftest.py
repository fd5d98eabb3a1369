"""Shared fixtures: stub clusters on free loopback ports, stopped by the test that made them."""

from __future__ import annotations

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.remoting.broker_client import BrokerClient


@pytest.fixture
async def cluster():
    """A name server and one broker with fast timers, for broker-level tests."""
    async with StubCluster(1, template=BrokerConfig(register_interval=1.0)) as stub:
        yield stub


@pytest.fixture
async def broker(cluster):
    return cluster.brokers[0]


@pytest.fixture
async def client(broker):
    """A BrokerClient connected to the single broker of ``cluster``."""
    client = BrokerClient(broker.name, broker.address)
    yield client
    await client.close()
