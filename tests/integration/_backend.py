"""One proxy test, two kinds of broker: the embedded stubs or the session's real RocketMQ.

The ``backend`` fixture (``tests/conftest.py``) hands a test one of these. A test asks it
for a proxy, a fresh topic and group, and for messages sent straight to a named broker;
the same test code then runs against ``broker_stub`` and against Apache RocketMQ. Both
backends have two brokers, ``broker-a`` and ``broker-b``.

On the real cluster (shared by the whole session) every test gets topic and group names of
its own, and its topic is created on both brokers before the test uses it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import TYPE_CHECKING

from proxy.remoting.broker_client import BrokerClient
from rocketmq_local import admin

if TYPE_CHECKING:
    from broker_stub import StubCluster

BROKERS = ("broker-a", "broker-b")
_names = itertools.count()


class Backend:
    kind = ""

    def __init__(self, start_proxy) -> None:
        self._start_proxy = start_proxy
        self.topic = ""
        self.group = ""

    @property
    def stub(self) -> bool:
        return self.kind == "stub"

    def new_names(self) -> tuple[str, str]:
        n = f"{os.getpid()}x{next(_names)}"
        return f"T{self.kind}{n}", f"G{self.kind}{n}"

    async def start(self, mode: str = "notify", **receive):
        """A proxy in front of this backend's brokers (the first call creates the topic)."""
        raise NotImplementedError

    def address(self, broker: str) -> str:
        raise NotImplementedError

    def broker_client(self, broker: str) -> BrokerClient:
        """A client of one broker, bypassing the proxy; the caller closes it."""
        return BrokerClient(broker, self.address(broker))

    @property
    def namesrv(self) -> str:
        raise NotImplementedError

    async def create_topic(self, topic: str, *, message_type: str | None = None) -> None:
        """Another topic, on both brokers (after ``start``), of ``message_type`` if given."""
        brokers = {b: self.address(b) for b in BROKERS}
        await asyncio.to_thread(
            admin.create_topic, self.namesrv, topic, message_type=message_type, brokers=brokers
        )

    async def create_group(self, group: str, **config) -> None:
        """The group on both brokers (after ``start``), with ``config`` as
        ``rocketmq_local.admin.create_group`` takes it (e.g. ``retry_max_times``)."""
        brokers = {b: self.address(b) for b in BROKERS}
        await asyncio.to_thread(admin.create_group, self.namesrv, group, brokers=brokers, **config)

    async def send_to(self, broker: str, body: bytes, *, tag: str | None = None, topic=None):
        """Send one message straight to ``broker``, bypassing the proxy."""
        client = self.broker_client(broker)
        try:
            return await client.send(topic or self.topic, body, tag=tag)
        finally:
            await client.close()

    async def max_offset(self, broker: str, topic: str, queue_id: int = 0) -> int:
        """GET_MAX_OFFSET of one broker's queue (0 for a topic it does not have yet)."""
        client = self.broker_client(broker)
        try:
            return await admin.max_offset(client, topic, queue_id)
        finally:
            await client.close()


class StubBackend(Backend):
    """Two embedded ``broker_stub`` brokers, started by the first proxy; later proxies front
    the same name server."""

    kind = "stub"

    def __init__(self, start_proxy) -> None:
        super().__init__(start_proxy)
        self.cluster: StubCluster | None = None
        self.topic, self.group = self.new_names()

    async def start(self, mode: str = "notify", **receive):
        if self.cluster is None:
            app = await self._start_proxy(
                mode=mode, brokers=len(BROKERS), topics=(self.topic,), **receive
            )
            self.cluster = app.cluster
            return app
        return await self._start_proxy(mode=mode, namesrv=self.stubs.namesrv_address, **receive)

    @property
    def stubs(self) -> StubCluster:
        """The broker stubs the first proxy started."""
        if self.cluster is None:
            raise RuntimeError("no proxy started yet: the first start() starts the stubs")
        return self.cluster

    def address(self, broker: str) -> str:
        return self.stubs.broker(broker).address

    @property
    def namesrv(self) -> str:
        return self.stubs.namesrv_address


class RealBackend(Backend):
    """The session's real RocketMQ cluster (``real_cluster``): name server, broker-a and
    broker-b. Admin calls are blocking socket calls: they run in a thread."""

    kind = "real"

    def __init__(self, start_proxy, cluster) -> None:
        super().__init__(start_proxy)
        self.cluster = cluster
        self.topic, self.group = self.new_names()
        self._created = False

    async def start(self, mode: str = "notify", **receive):
        if not self._created:
            await asyncio.to_thread(self.cluster.create_topic, self.topic)
            self._created = True
        return await self._start_proxy(mode=mode, namesrv=self.cluster.namesrv_address, **receive)

    def address(self, broker: str) -> str:
        return self.cluster.broker(broker).address

    @property
    def namesrv(self) -> str:
        return self.cluster.namesrv_address
