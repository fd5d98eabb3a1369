"""A name server and N brokers in the current event loop: for ``--embedded-brokers``,
tests and benchmarks."""

from __future__ import annotations

import dataclasses

from broker_stub.broker import Broker
from broker_stub.config import BrokerConfig, NamesrvConfig
from broker_stub.namesrv import NameServer


def broker_name(index: int) -> str:
    """broker-a, broker-b, ... broker-z, then broker-26, broker-27, ..."""
    return f"broker-{chr(ord('a') + index)}" if index < 26 else f"broker-{index}"


class StubCluster:
    """``async with StubCluster(3) as cluster:`` runs a name server and three brokers on
    free loopback ports. ``template`` sets every broker's options (name, port and name
    server are filled in)."""

    def __init__(
        self,
        brokers: int = 3,
        *,
        host: str = "127.0.0.1",
        namesrv_port: int = 0,
        broker_ports: list[int] | None = None,
        template: BrokerConfig | None = None,
        namesrv_config: NamesrvConfig | None = None,
    ) -> None:
        self.namesrv = NameServer(namesrv_config or NamesrvConfig(host=host, port=namesrv_port))
        self._count = brokers
        self._host = host
        self._ports = broker_ports or [0] * brokers
        self._template = template or BrokerConfig()
        self.brokers: list[Broker] = []

    @property
    def namesrv_address(self) -> str:
        return self.namesrv.address

    async def start(self) -> StubCluster:
        await self.namesrv.start()
        try:
            for index in range(self._count):
                config = dataclasses.replace(
                    self._template,
                    name=broker_name(index),
                    host=self._host,
                    port=self._ports[index],
                    namesrv_addrs=[self.namesrv.address],
                    topics=list(self._template.topics),
                )
                broker = Broker(config)
                self.brokers.append(broker)
                await broker.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        for broker in reversed(self.brokers):
            await broker.stop()
        self.brokers.clear()
        await self.namesrv.stop()

    def broker(self, name: str) -> Broker:
        return next(b for b in self.brokers if b.name == name)

    async def __aenter__(self) -> StubCluster:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
