"""A stub name server: brokers register their topics, clients ask for topic routes."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from broker_stub.config import NamesrvConfig
from broker_stub.handlers import RequestError, dispatch
from proxy.background import start_background, stop_background
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import (
    BrokerHeartbeatHeader,
    RegisterBrokerHeader,
    TopicHeader,
    UnregisterBrokerHeader,
)
from proxy.remoting.server import RemotingServer

log = logging.getLogger(__name__)


@dataclass
class BrokerEntry:
    """A registered broker (one name; id 0 is the master, others are slaves)."""

    name: str
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)
    last_seen: dict[int, float] = field(default_factory=dict)  # loop time per broker id
    timeout: dict[int, float] = field(default_factory=dict)
    queues: dict[str, dict[str, str | int]] = field(default_factory=dict)  # topic -> QueueData JSON


# What serves one request code (see ``broker_stub.handlers.dispatch``).
_Handler = Callable[[RemotingCommand, RemotingConnection], RemotingCommand]


class NameServer:
    def __init__(self, config: NamesrvConfig | None = None) -> None:
        self.config = config or NamesrvConfig()
        self.brokers: dict[str, BrokerEntry] = {}
        self.server: RemotingServer | None = None
        self._scan_task: asyncio.Task[None] | None = None
        self._handlers: dict[int, _Handler] = {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.BROKER_HEARTBEAT: self.broker_heartbeat,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.route_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.topic_list,
        }

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    async def start(self) -> None:
        self.server = RemotingServer(self._process)
        self.config.port = await self.server.start(self.config.host, self.config.port)
        self._scan_task = start_background(self._scan_loop(), name="namesrv-scan", log=log)
        log.info("name server listening on %s", self.address)

    async def stop(self) -> None:
        task, self._scan_task = self._scan_task, None
        await stop_background(task)
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def _process(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return dispatch(self._handlers, cmd, conn)

    # -- brokers --------------------------------------------------------------------------

    def register_broker(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = RegisterBrokerHeader.decode(cmd.ext_fields)
        name, addr, cluster, broker_id = h.broker_name, h.broker_addr, h.cluster_name, h.broker_id
        if h.body_crc32 and h.body_crc32 != zlib.crc32(cmd.body) & 0x7FFFFFFF:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        if h.compressed:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, "compressed registration is not supported"
            )
        try:
            body = orjson.loads(cmd.body) if cmd.body else {}
            table = (body.get("topicConfigSerializeWrapper") or {}).get("topicConfigTable") or {}
        except (orjson.JSONDecodeError, AttributeError):
            raise RequestError(
                ResponseCode.INVALID_PARAMETER, "register body is not JSON"
            ) from None
        entry = self.brokers.get(name)
        if entry is None or entry.cluster != cluster:
            entry = self.brokers[name] = BrokerEntry(name, cluster)
        entry.addrs[broker_id] = addr
        entry.last_seen[broker_id] = asyncio.get_running_loop().time()
        entry.timeout[broker_id] = (
            h.heartbeat_timeout_millis or 0
        ) / 1000 or self.config.broker_timeout
        if broker_id == 0:
            entry.queues = {topic: _queue_data(name, conf) for topic, conf in table.items()}
        return cmd.make_response(ResponseCode.SUCCESS)

    def unregister_broker(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = UnregisterBrokerHeader.decode(cmd.ext_fields)
        self._remove(h.broker_name, h.broker_id)
        return cmd.make_response(ResponseCode.SUCCESS)

    def broker_heartbeat(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = BrokerHeartbeatHeader.decode(cmd.ext_fields)
        entry = self.brokers.get(h.broker_name)
        broker_id = h.broker_id
        if entry is not None and broker_id in entry.addrs:
            entry.last_seen[broker_id] = asyncio.get_running_loop().time()
        return cmd.make_response(ResponseCode.SUCCESS)

    def _remove(self, name: str, broker_id: int) -> None:
        entry = self.brokers.get(name)
        if entry is None:
            return
        entry.addrs.pop(broker_id, None)
        entry.last_seen.pop(broker_id, None)
        if broker_id == 0 or not entry.addrs:
            del self.brokers[name]
            log.info("broker %s removed", name)

    def expire(self) -> list[str]:
        """Drop brokers that stopped registering; return their names."""
        now = asyncio.get_running_loop().time()
        expired = []
        for entry in list(self.brokers.values()):
            for broker_id, seen in list(entry.last_seen.items()):
                if now - seen > entry.timeout.get(broker_id, self.config.broker_timeout):
                    expired.append(entry.name)
                    self._remove(entry.name, broker_id)
        return expired

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval)
            for name in self.expire():
                log.warning("broker %s expired: no registration for too long", name)

    # -- routes ---------------------------------------------------------------------------

    def route(self, topic: str) -> dict[str, object] | None:
        """TopicRouteData as RocketMQ encodes it, or None when no broker serves ``topic``."""
        brokers = [e for e in self.brokers.values() if topic in e.queues and 0 in e.addrs]
        if not brokers:
            return None
        return {
            "brokerDatas": [
                {
                    "brokerAddrs": {str(i): a for i, a in sorted(e.addrs.items())},
                    "brokerName": e.name,
                    "cluster": e.cluster,
                    "enableActingMaster": False,
                }
                for e in sorted(brokers, key=lambda e: e.name)
            ],
            "filterServerTable": {},
            "queueDatas": [e.queues[topic] for e in sorted(brokers, key=lambda e: e.name)],
        }

    def route_by_topic(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        topic = TopicHeader.decode(cmd.ext_fields).topic
        route = self.route(topic)
        if route is None:
            return cmd.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {topic}",
            )
        return cmd.make_response(ResponseCode.SUCCESS, body=orjson.dumps(route))

    def cluster_info(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        clusters: dict[str, list[str]] = {}
        for entry in self.brokers.values():
            clusters.setdefault(entry.cluster, []).append(entry.name)
        body = {
            "brokerAddrTable": {
                e.name: {
                    "brokerAddrs": {str(i): a for i, a in e.addrs.items()},
                    "brokerName": e.name,
                    "cluster": e.cluster,
                }
                for e in self.brokers.values()
            },
            "clusterAddrTable": clusters,
        }
        return cmd.make_response(ResponseCode.SUCCESS, body=orjson.dumps(body))

    def topic_list(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        topics = sorted({t for e in self.brokers.values() for t in e.queues})
        return cmd.make_response(ResponseCode.SUCCESS, body=orjson.dumps({"topicList": topics}))


def _queue_data(broker_name: str, conf: dict[str, Any]) -> dict[str, str | int]:
    return {
        "brokerName": broker_name,
        "perm": int(conf.get("perm", 6)),
        "readQueueNums": int(conf.get("readQueueNums", 0)),
        "topicSysFlag": int(conf.get("topicSysFlag", 0)),
        "writeQueueNums": int(conf.get("writeQueueNums", 0)),
    }
