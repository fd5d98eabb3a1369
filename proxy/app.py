"""The proxy: brokers, processors, receive engine, gRPC front and ops server, wired
together, started and stopped in order. It fronts whatever brokers the name servers of its
configuration list; ``proxy.cli`` composes embedded broker stubs in front of it."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import grpc

from proxy.api.ack import AckActivity
from proxy.api.lite import LiteActivity
from proxy.api.receive import ReceiveActivity
from proxy.api.route import RouteActivity
from proxy.api.send import SendActivity
from proxy.api.service import MessagingService
from proxy.api.session import SessionActivity
from proxy.api.transaction import TransactionActivity
from proxy.api.v2 import service_pb2_grpc
from proxy.brokers import BrokerPool
from proxy.config import ProxyConfig
from proxy.groups import GroupSettings
from proxy.observability.eventlog import EventLog
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.ops import OpsServer
from proxy.observability.receive_record import ReceiveRecorder
from proxy.processor.consumer import ConsumerProcessor
from proxy.processor.lite import LiteProcessor
from proxy.processor.producer import ProducerProcessor
from proxy.processor.renewal import HandleRenewer
from proxy.processor.transaction import TransactionProcessor
from proxy.receive.engine import ReceiveEngine
from proxy.security.runtime import SecurityRuntime

log = logging.getLogger(__name__)


class ProxyApp:
    def __init__(self, config: ProxyConfig, *, reuse_port: bool = False) -> None:
        """``reuse_port``: bind the gRPC port with SO_REUSEPORT, sharing it with the other
        workers of a ``--workers N`` group (the kernel spreads connections over them)."""
        self.config = config
        self.reuse_port = reuse_port
        self.metrics = ProxyMetrics()
        self.events: EventLog | None = None
        self.ready = False
        self.stopped = False
        self.started_at = time.time()

    async def start(self) -> None:
        config = self.config
        if config.event_log_dir:
            self.events = EventLog(config.event_log_dir, config.proxy_id)
            self.events.start()
        # TLS, client authentication and broker signing: all off unless configured.
        self.security = SecurityRuntime(config.security, self.metrics.registry)
        await self.security.start()
        self.pool = BrokerPool(
            config.namesrv_addrs,
            config.route_ttl_s,
            observer=self._observe_broker_call,
            timeout_s=config.receive.broker_timeout_s,
            request_hook=self.security.signer,
        )
        rc = config.receive
        self.consumer = ConsumerProcessor(
            self.pool,
            broker_timeout_s=rc.broker_timeout_s,
            hand_back_invisible_ms=rc.hand_back_invisible_ms,
            on_hand_back=self.metrics.handed_back,
        )
        self.producer = ProducerProcessor(self.pool, rc.broker_timeout_s)
        self.lite = LiteProcessor(self.pool, rc.broker_timeout_s)
        self.lite.start()
        self.transactions = TransactionProcessor(
            self.pool,
            client_id=f"rmq-notify-proxy@{config.proxy_id}",
            broker_timeout_s=rc.broker_timeout_s,
        )
        self.transactions.start()
        self.engine = ReceiveEngine(rc, self.pool, self.consumer, self.metrics)
        self.groups = GroupSettings(self.pool, ttl_s=config.route_ttl_s)
        self.renewer = HandleRenewer(
            self.consumer,
            slice_ms=rc.renew_slice_ms,
            client_idle_s=rc.push_client_idle_s,
            max_failures=3,
        )
        self.renewer.start()
        await self.engine.start()
        self.grpc_server = grpc.aio.server(
            options=[
                # Room for bodies over the limit, so the proxy itself can answer
                # MESSAGE_BODY_TOO_LARGE instead of gRPC's own error.
                ("grpc.max_receive_message_length", 4 * config.max_body_bytes + (1 << 20)),
                ("grpc.max_send_message_length", 4 * config.max_body_bytes + (1 << 20)),
                *([("grpc.so_reuseport", 1)] if self.reuse_port else []),
            ]
        )
        listen = f"{config.grpc_host}:{config.grpc_port}"
        if self.security.tls is not None:
            credentials = self.security.tls.grpc_credentials()
            config.grpc_port = self.grpc_server.add_secure_port(listen, credentials)
        else:
            config.grpc_port = self.grpc_server.add_insecure_port(listen)
        advertise = config.advertise_address or f"{config.grpc_host}:{config.grpc_port}"
        self.receive = ReceiveActivity(
            rc,
            self.engine,
            self.consumer,
            ReceiveRecorder(config.proxy_id, self.metrics, self.events),
            self.groups,
            self.renewer,
        )
        self.service = MessagingService(
            route=RouteActivity(self.pool, advertise),
            session=SessionActivity(
                config, self.groups, self.renewer, self.transactions, self.lite
            ),
            send=SendActivity(
                self.pool,
                self.producer,
                self.metrics,
                config.max_body_bytes,
                config.max_lite_topic_size,
            ),
            receive=self.receive,
            ack=AckActivity(self.consumer, rc.max_delivery_attempts, self.renewer),
            metrics=self.metrics,
            guard=self.security.guard,
            transaction=TransactionActivity(self.transactions),
            lite=LiteActivity(self.lite, config.max_lite_topic_size),
        )
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, self.grpc_server)
        await self.grpc_server.start()
        self.ops = OpsServer(
            self.metrics,
            status=self.status,
            ready=lambda: self.ready,
            ssl_context=self.security.ops_ssl_context(),
        )
        config.http_port = await self.ops.start(config.http_host, config.http_port)
        self.metrics.set_long_poll_limit(config.receive.max_in_flight)
        self.ready = True
        self.metrics.set_ready(True)
        log.info(
            "proxy %s ready: grpc %s:%s, http %s:%s",
            config.proxy_id,
            config.grpc_host,
            config.grpc_port,
            config.http_host,
            config.http_port,
        )

    def _observe_broker_call(
        self, request: str, response: str, seconds: float, broker: str, long_polling: bool
    ) -> None:
        self.metrics.rpc(
            "remoting", request, response, seconds, broker=broker, is_long_polling=long_polling
        )

    async def stop(self) -> None:
        """Graceful stop: not ready at once, refuse new polls, answer those in flight, hand
        back what was not delivered, then close everything. Safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        self.ready = False
        self.metrics.set_ready(False)
        self.receive.accepting = False
        self.engine.stop_polls()
        await self.grpc_server.stop(grace=min(self.config.shutdown_grace_s, 10.0))
        await self.engine.close()
        await self.renewer.close()
        await self.consumer.close()
        await self.transactions.close()
        await self.pool.close()
        await self.ops.stop()
        await self.security.close()
        if self.events is not None:
            await self.events.close()

    def status(self) -> dict[str, object]:
        status = self._status()
        if self.security.enabled:
            status["security"] = self.security.status()
        return status

    def _status(self) -> dict[str, object]:
        return {
            "proxy_id": self.config.proxy_id,
            "pid": os.getpid(),
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "grpc": f"{self.config.grpc_host}:{self.config.grpc_port}",
            "namesrv": self.config.namesrv_addrs,
            "brokers": {
                name: {"address": c.address, "connected": c.remoting.connected}
                for name, c in self.pool.brokers.items()
            },
            "receive": self.engine.status(),
            # Every task on the loop: a leak shows as a count that keeps growing.
            "tasks": len(asyncio.all_tasks()),
            "event_log": self.events.stats() if self.events is not None else None,
        }
