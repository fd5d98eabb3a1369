"""One stub broker: store, POP service, long polling and a remoting server, wired together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from typing import Any

import orjson

from broker_stub.config import BrokerConfig
from broker_stub.polling import PollingTable
from broker_stub.pop import PopService
from broker_stub.processor import BrokerProcessor
from broker_stub.store import MessageStore
from broker_stub.timers import DeliveryScheduler
from broker_stub.topics import TopicTable
from broker_stub.transactions import TransactionService
from proxy.background import start_background, stop_background
from proxy.remoting.client import RemotingClient, RemotingError
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import RegisterBrokerHeader, TopicHeader, UnregisterBrokerHeader, now_ms
from proxy.remoting.lite import LMQ_PREFIX
from proxy.remoting.server import RemotingServer

log = logging.getLogger(__name__)

REGISTER_TIMEOUT = 3.0


class Broker:
    """A POP broker. ``await start()`` listens and registers with the name servers;
    ``await stop()`` unregisters and releases everything it holds."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.topics = TopicTable(config.default_queue_nums, on_change=self._topics_changed)
        self.store = MessageStore(
            retain_per_queue=config.retain_per_queue, on_arrival=self._on_arrival
        )
        self.server: RemotingServer | None = None
        self._namesrv_clients = [RemotingClient(addr) for addr in config.namesrv_addrs]
        self._register_task: asyncio.Task[None] | None = None
        self._register_now = asyncio.Event()
        self._started = False

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def address(self) -> str:
        return self.config.address

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        self.pop = PopService(self.store, self.topics, config, loop)
        self.pops = PollingTable(loop, config.polling_per_key, config.polling_total)
        self.notifications = PollingTable(
            loop, config.polling_per_key, config.polling_total, wake_newest=True
        )
        self.scheduler = DeliveryScheduler(self.store, loop)
        self.pop.put = self.scheduler.put
        self.transactions = TransactionService(
            self.store,
            self.scheduler,
            loop,
            check_interval_ms=config.transaction_check_interval_ms,
            timeout_ms=config.transaction_timeout_ms,
            check_max=config.transaction_check_max,
        )
        self.transactions.start()
        self.processor = BrokerProcessor(
            config,
            self.store,
            self.topics,
            self.pop,
            self.pops,
            self.notifications,
            self.scheduler,
            self.transactions,
            self.parent_route if self._namesrv_clients else None,
        )
        self.server = RemotingServer(self.processor, max_frame=config.max_frame)
        config.port = await self.server.start(config.host, config.port)
        for topic in config.topics:
            self.topics.create(topic)
        self._started = True
        if self._namesrv_clients:
            await self.register()
            self._register_task = start_background(
                self._register_loop(), name=f"register-{self.name}", log=log
            )
        log.info("broker %s listening on %s", self.name, self.address)

    async def stop(self) -> None:
        task, self._register_task = self._register_task, None
        await stop_background(task)
        if self._started:
            await self._unregister()
            self.pops.close()
            self.notifications.close()
            self.processor.lite_polls.close()
            self.processor.lite.close()
            self.pop.close()
            self.scheduler.close()
            await self.transactions.close()
        if self.server is not None:
            await self.server.stop()
        for client in self._namesrv_clients:
            await client.close()
        self._started = False

    # -- long polling hook ----------------------------------------------------------------

    def _on_arrival(self, topic: str, queue_id: int) -> None:
        if not self._started:
            return
        if topic.startswith(LMQ_PREFIX):
            self.processor.lite.on_arrival(topic)
            return
        origin = self.pop.retry_origins.get(topic)
        if origin is not None:
            # A revived message: only its group can pop it, from any queue's pop.
            group, origin_topic = origin
            self.pops.wake(origin_topic, None, group)
            self.notifications.wake(origin_topic, None, group)
        else:
            self.pops.wake(topic, queue_id)
            self.notifications.wake(topic, queue_id)

    async def parent_route(self, topic: str) -> list[dict[str, Any]] | None:
        """The queueDatas of ``topic``'s route from the first name server that has one
        (which broker owns a lite topic depends on it, as on a RocketMQ broker)."""
        request = TopicHeader(topic).encode()
        for client in self._namesrv_clients:
            try:
                response = await client.invoke(
                    RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, dict(request)),
                    REGISTER_TIMEOUT,
                )
            except RemotingError as exc:
                log.warning("broker %s: name server %s: %s", self.name, client.address, exc)
                continue
            if response.code == ResponseCode.SUCCESS and response.body:
                return list(orjson.loads(response.body).get("queueDatas") or [])
        return None

    # -- name server registration ---------------------------------------------------------

    def _topics_changed(self) -> None:
        self._register_now.set()

    async def _register_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._register_now.wait(), self.config.register_interval)
            self._register_now.clear()
            await self.register()

    async def register(self) -> None:
        """Register with every name server (failures are logged; the next round retries)."""
        body = orjson.dumps(
            {
                "filterServerList": [],
                "topicConfigSerializeWrapper": {
                    "dataVersion": {
                        "counter": self.topics.version,
                        "stateVersion": 0,
                        "timestamp": now_ms(),
                    },
                    "topicConfigTable": {t.name: t.to_json() for t in self.topics.all()},
                },
            }
        )
        header = RegisterBrokerHeader(
            broker_name=self.name,
            broker_addr=self.address,
            cluster_name=self.config.cluster,
            ha_server_addr=self.address,
            broker_id=0,
            heartbeat_timeout_millis=int(max(self.config.register_interval * 4, 10) * 1000),
            body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
        )
        await self._to_namesrvs(RequestCode.REGISTER_BROKER, header.encode(), body)

    async def _unregister(self) -> None:
        header = UnregisterBrokerHeader(self.name, self.address, self.config.cluster, 0)
        await self._to_namesrvs(RequestCode.UNREGISTER_BROKER, header.encode(), b"")

    async def _to_namesrvs(self, code: int, fields: dict[str, str], body: bytes) -> None:
        async def one(client: RemotingClient) -> None:
            try:
                response = await client.invoke(
                    RemotingCommand(code, dict(fields), body), REGISTER_TIMEOUT
                )
            except RemotingError as exc:
                log.warning("broker %s: name server %s: %s", self.name, client.address, exc)
                return
            if response.code != ResponseCode.SUCCESS:
                log.warning(
                    "broker %s: name server %s answered %s %s",
                    self.name,
                    client.address,
                    response.code,
                    response.remark,
                )

        await asyncio.gather(*(one(c) for c in self._namesrv_clients))
