"""One broker conformance suite, two backends: every test runs against the stub
(``broker_stub``, a fresh two-broker ``StubCluster`` per test) and against real Apache
RocketMQ 5 (the session's ``real_cluster``, shared, so every test takes fresh topic and
group names from ``backend.unique``). Both are set up the same way: topics and groups are
created with UPDATE_AND_CREATE_TOPIC / UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on every broker.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.client import RemotingClient
from rocketmq_local import admin


@dataclass(frozen=True)
class BrokerRef:
    name: str
    address: str


@dataclass
class Cluster:
    """What a conformance test sees of a cluster of brokers, stub or real (the ``backend``
    fixture); the proxy tests' Backend (tests/integration/_backend.py) puts a proxy in front
    of one."""

    kind: str  # "stub" or "real"
    namesrv: str
    brokers: list[BrokerRef]
    stub: StubCluster | None = None
    _clients: list = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.kind == "real"

    @property
    def broker(self) -> BrokerRef:
        return self.brokers[0]

    def unique(self, prefix: str) -> str:
        """A topic or group name no other test of the session uses."""
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    def client(self, broker: BrokerRef | None = None) -> BrokerClient:
        """A BrokerClient on ``broker`` (the first by default), closed after the test."""
        broker = broker or self.broker
        client = BrokerClient(broker.name, broker.address)
        self._clients.append(client)
        return client

    def remoting(self, address: str) -> RemotingClient:
        client = RemotingClient(address)
        self._clients.append(client)
        return client

    async def create_topic(
        self, topic: str, queues: int = 4, *, message_type: str | None = None
    ) -> None:
        """The topic on every broker, routed with ``queues`` queues each, of
        ``message_type`` (its message.type attribute) if given (``rocketmq_local.admin``)."""
        await asyncio.to_thread(
            admin.create_topic, self.namesrv, topic, queues, message_type=message_type,
            brokers=self._addresses(),
        )  # fmt: skip

    async def create_group(
        self,
        group: str,
        retry_max_times: int = 16,
        *,
        fifo: bool = False,
        attributes: dict[str, str] | None = None,
    ) -> None:
        """The group on every broker (``fifo``: consumeMessageOrderly; ``rocketmq_local.admin``)."""
        await asyncio.to_thread(
            admin.create_group, self.namesrv, group, retry_max_times=retry_max_times,
            fifo=fifo, attributes=attributes, brokers=self._addresses(),
        )  # fmt: skip

    def _addresses(self) -> dict[str, str]:
        return {b.name: b.address for b in self.brokers}

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()


@pytest.fixture(params=["stub", pytest.param("real", marks=pytest.mark.real)])
async def backend(request):
    if request.param == "stub":
        template = BrokerConfig(register_interval=1.0)
        async with StubCluster(2, template=template) as cluster:
            refs = [BrokerRef(b.name, b.address) for b in cluster.brokers]
            be = Cluster("stub", cluster.namesrv_address, refs, stub=cluster)
            try:
                yield be
            finally:
                await be.close()
    else:
        cluster = request.getfixturevalue("real_cluster")
        refs = [BrokerRef(b.name, b.address) for b in cluster.brokers]
        be = Cluster("real", cluster.namesrv_address, refs)
        try:
            yield be
        finally:
            await be.close()
