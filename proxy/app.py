"""The proxy: brokers, processors, receive engine, gRPC front and ops server, wired
together, started and stopped in order. It fronts whatever brokers the name servers of its
configuration list; ``proxy.cli`` composes embedded broker stubs in front of it."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol

import grpc

from proxy.api.ack import AckActivity
from proxy.api.connections import Connections
from proxy.api.lite import LiteActivity
from proxy.api.otlp import ClientMetricsService
from proxy.api.receive import ReceiveActivity
from proxy.api.route import RouteActivity
from proxy.api.send import SendActivity
from proxy.api.service import MessagingService
from proxy.api.session import SessionActivity
from proxy.api.transaction import TransactionActivity
from proxy.api.v2 import service_pb2_grpc
from proxy.background import waiting_at
from proxy.brokers import BrokerPool
from proxy.collector import FullCollections
from proxy.config import ProxyConfig
from proxy.descriptors import process_budget
from proxy.drain import Drain
from proxy.fleet.members import Members
from proxy.fleet.settle import FleetSettles
from proxy.fleet.transport import FleetLinks, PeerHandlers
from proxy.groups import GroupSettings
from proxy.observability.eventlog import EventLog
from proxy.observability.lag import GroupLag
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.ops import OpsServer
from proxy.observability.receive_record import ReceiveRecorder
from proxy.processor.consumer import ConsumerProcessor
from proxy.processor.lite import LiteProcessor
from proxy.processor.producer import ProducerProcessor
from proxy.processor.registrations import Registrations
from proxy.processor.renewal import HandleRenewer
from proxy.processor.transaction import TransactionProcessor
from proxy.receive.engine import ReceiveEngine
from proxy.remoting_port.port import RemotingPort
from proxy.security.config import TlsMode
from proxy.security.front import TlsFront, Transport
from proxy.security.runtime import SecurityRuntime
from proxy.security.self_signed import proxy_hosts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One step of the start: what it starts, and the undo that stops it. ``watched``: a
    stop still under way after ``STUCK_STOP_S`` is logged with the line it waits at (the
    gRPC server's drain names what holds it by itself, and legitimately takes longer)."""

    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]
    watched: bool = True


class Background(Protocol):
    """A part that owns a background task: ``start`` starts it, ``close`` stops it."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


def background_step(name: str, part: Background | None) -> Step:
    """The step of a ``Background`` part; None: a part the configuration turns off."""

    async def start() -> None:
        if part is not None:
            part.start()

    async def stop() -> None:
        if part is not None:
            await part.close()

    return Step(name, start, stop)


# A part whose stop takes longer than this is logged once it ends (``ProxyApp._timed_stop``).
SLOW_STOP_S = 2.0
# A part still stopping after this is logged while it waits, with where it waits: a stop that
# never ends holds a rolling restart until the supervisor's SIGKILL, which leaves no other
# trace of which part it was.
STUCK_STOP_S = 5.0


def pending_calls_options(max_in_flight: int) -> list[tuple[str, int]]:
    """grpcio's limits on calls it holds before the server asks for them (its defaults:
    1,000, beyond which it cancels a growing share at random, and 3,000), raised so that
    a storm of every poll the proxy may hold, twice over, waits to be taken up instead.
    The names have a dot after ``server`` (grpcio 1.85)."""
    pending = 2 * max(max_in_flight, 1_000)
    return [
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]


async def _nothing() -> None:
    """A step with nothing to start (its part needs only stopping) or nothing to stop."""


class ProxyApp:
    """Every part of one proxy, built here in ``__init__``; ``start`` starts them in order
    and, if a step fails, stops what it had started, in reverse order; ``stop`` drains the
    polls in flight, then stops everything in reverse order. What the start learns (the
    bound ports) is on the app (``grpc_port``, ``http_port``), never written into the
    configuration."""

    def __init__(self, config: ProxyConfig, *, reuse_port: bool = False) -> None:
        """``reuse_port``: bind the gRPC port with SO_REUSEPORT, sharing it with the other
        workers of a ``--workers N`` group (the kernel spreads connections over them)."""
        self.config = config
        self.reuse_port = reuse_port
        self.grpc_port = config.grpc_port  # the bound port once started (0: a free one)
        self.http_port = config.http_port
        self.ready = False
        self.stopped = False
        self.started_at = time.time()
        self._undo = AsyncExitStack()

        rc = config.receive
        # With workers, the supervisor's multiprocess directory: where the live gauges go.
        self.metrics = ProxyMetrics(directory=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.collections = FullCollections(config.gc_full_collection_s, self.metrics)
        self.events = (
            EventLog(
                config.event_log_dir,
                config.proxy_id,
                log_format=config.event_log_format,
                max_bytes=config.event_log_max_bytes,
                max_age_seconds=config.event_log_max_age_s,
            )
            if config.event_log_dir
            else None
        )
        # TLS (permissive, self-signed unless given a certificate), client authentication and
        # broker signing (off unless configured).
        self.security = SecurityRuntime(
            config.security, self.metrics.registry, hosts=proxy_hosts(config)
        )
        self.pool = BrokerPool(
            config.namesrv_addrs,
            config.route_ttl_s,
            observer=self._observe_broker_call,
            timeout_s=rc.broker_timeout_s,
            request_hook=self.security.signer,
        )
        self.consumer = ConsumerProcessor(
            self.pool,
            broker_timeout_s=rc.broker_timeout_s,
            hand_back_invisible_ms=rc.hand_back_invisible_ms,
            on_hand_back=self.metrics.handed_back,
        )
        self.producer = ProducerProcessor(self.pool, rc.broker_timeout_s)
        self.lite = LiteProcessor(self.pool, rc.broker_timeout_s)
        self.transactions = TransactionProcessor(
            self.pool,
            client_id=f"rmq-notify-proxy@{config.proxy_id}",
            broker_timeout_s=rc.broker_timeout_s,
            on_check=self.metrics.transaction_check,
        )
        fleet = config.fleet
        self.fleet = (
            FleetLinks(
                Members(fleet.peers, fleet.refresh_s), f"{fleet.host}:{fleet.port}", fleet.advertise
            )
            if fleet.enabled
            else None
        )
        self.engine = ReceiveEngine(
            rc, self.pool, self.consumer, self.metrics,
            links=self.fleet, fallback_s=fleet.fallback_ms / 1000,
        )  # fmt: skip
        self.groups = GroupSettings(
            self.pool, ttl_s=config.route_ttl_s, unknown_max_attempts=rc.max_delivery_attempts
        )
        self.renewer = HandleRenewer(
            self.consumer,
            slice_ms=rc.renew_slice_ms,
            client_idle_s=rc.push_client_idle_s,
            max_failures=3,
        )
        self.receive = ReceiveActivity(
            rc,
            self.engine,
            self.consumer,
            ReceiveRecorder(config.proxy_id, self.metrics, self.events),
            self.groups,
            self.renewer,
            config.limits,
        )
        # The address routes advertise is known once the gRPC port is bound (start).
        self.route = RouteActivity(self.pool, config.advertise_address or "")
        # Each gRPC client registered with the brokers, for RocketMQ's own tools.
        # Only what the guard allows; bounded per process, per group and in connections,
        # which share the process's open-files budget with the fronts' relays.
        self.registrations = (
            Registrations(
                self.pool,
                max_clients=config.max_registered_clients,
                max_per_group=config.max_registered_per_group,
                on_refused=self.metrics.registration_refused,
            )
            if config.max_registered_clients
            else None
        )
        # How far behind each of those consumers' groups is, on /metrics.
        self.lag = (
            GroupLag(
                self.pool, self.metrics, self.registrations.consumed,
                refresh_s=config.lag_refresh_s, timeout_s=rc.broker_timeout_s,
            )
            if self.registrations is not None and config.lag_refresh_s
            else None
        )  # fmt: skip
        self.session = SessionActivity(
            config, self.groups, self.renewer, self.transactions, self.lite, self.registrations
        )
        self.renewer.streams_open = self.session.holds_stream
        if self.registrations is not None:
            self.registrations.ask = self.session.ask
        # In a fleet, an ack of a message another member renews borrows its checkpoint.
        self.settles = FleetSettles(self.fleet, self.renewer) if self.fleet is not None else None
        self.service = MessagingService(
            route=self.route,
            session=self.session,
            send=SendActivity(
                self.pool,
                self.producer,
                self.metrics,
                config.max_body_bytes,
                config.max_lite_topic_size,
                config.limits,
            ),
            receive=self.receive,
            ack=AckActivity(
                self.consumer, rc.max_delivery_attempts, self.renewer, config.limits, self.settles
            ),
            metrics=self.metrics,
            transaction=TransactionActivity(self.transactions),
            lite=LiteActivity(self.lite, config.max_lite_topic_size),
            connections=Connections(config.grpc_max_connection_age_s),
        )
        # The clients' own metrics: the OTLP Export RPC in client_metrics.mode = proxy.
        self.client_metrics = ClientMetricsService(
            config.client_metrics,
            self.metrics,
            lambda: self.service.guard,
            directory=os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
        )
        self.ops = OpsServer(
            self.metrics,
            status=self.status,
            ready=lambda: self.ready,
        )
        # The remoting port for the clients of RocketMQ's own protocol (off unless set).
        self.remoting = (
            RemotingPort(
                self.pool,
                advertise=config.remoting_advertise_address or "",
                broker_advertise=config.remoting_broker_advertise_addresses,
                observe=functools.partial(self.metrics.rpc, "remoting_port"),
                security=self.security,
                recorder=self.receive.recorder,
                budget=process_budget(),
            )
            if config.remoting_port is not None
            else None
        )
        self.remoting_port = config.remoting_port
        # Each broker's own remoting port, as bound.
        self.remoting_broker_ports: dict[str, int] = {}
        # TLS and plaintext remoting clients: the shared port's front, then each broker's.
        self.remoting_fronts: list[TlsFront] = []
        self.grpc_server: grpc.aio.Server | None = None
        # The client port's front: TLS and plaintext clients on one port (not enforcing).
        self.front: TlsFront | None = None

    def _steps(self) -> list[Step]:
        """The start, in order; ``stop`` undoes it backwards: the gRPC server drains first,
        the event log closes last. The ops server starts early and stops late, so that it
        answers "not ready" while the proxy starts and drains."""

        async def start_security() -> None:
            await self.security.start(self.pool.ask_any_broker)
            self.service.guard = self.security.guard  # built from the users just read

        async def start_ops() -> None:
            self.http_port = await self.ops.start(
                self.config.http_host, self.config.http_port, self.security.ops_ssl_context()
            )

        async def start_lite() -> None:
            self.lite.start()

        return [
            background_step("garbage collector", self.collections),
            background_step("event log", self.events),
            Step("security", start_security, self.security.close),
            Step("ops server", start_ops, self.ops.stop),
            Step("brokers", _nothing, self.pool.close),
            Step("consumer", _nothing, self.consumer.close),
            background_step("transactions", self.transactions),
            background_step("registrations", self.registrations),
            background_step("consumer lag", self.lag),
            Step("lite", start_lite, _nothing),
            background_step("renewer", self.renewer),
            Step("receive engine", self.engine.start, self.engine.close),
            Step("fleet links", self._start_fleet, self._stop_fleet),
            Step("client metrics", self.client_metrics.start, self.client_metrics.close),
            Step("grpc server", self._start_grpc, self._stop_grpc, watched=False),
            Step("remoting port", self._start_remoting, self._stop_remoting),
        ]

    async def start(self) -> None:
        """Start every part; on a failure, stop what started (in reverse) and raise."""
        try:
            for step in self._steps():
                await step.start()
                self._undo.push_async_callback(self._timed_stop, step)
        except BaseException:
            log.error("proxy %s did not start; stopping what did", self.config.proxy_id)
            self.stopped = True
            await self._undo.aclose()
            raise
        self.metrics.set_long_poll_limit(self.config.receive.max_in_flight)
        self.ready = True
        self.metrics.set_ready(True)
        log.info(
            "proxy %s ready: grpc %s:%s, http %s:%s",
            self.config.proxy_id,
            self.config.grpc_host,
            self.grpc_port,
            self.config.http_host,
            self.http_port,
        )

    async def _timed_stop(self, step: Step) -> None:
        """Stop ``step``; one that takes long is named (a stop that takes seconds holds a
        rolling restart, and the operator needs to know which part held it)."""
        started = time.monotonic()
        stopping = asyncio.ensure_future(step.stop())
        try:
            if step.watched:
                await asyncio.wait({stopping}, timeout=STUCK_STOP_S)
                if not stopping.done():
                    log.warning("proxy %s: still stopping the %s after %.0f s, waiting at %s",
                                self.config.proxy_id, step.name, STUCK_STOP_S,
                                waiting_at(stopping))  # fmt: skip
            await stopping
        finally:
            stopping.cancel()  # this stop cancelled while it waited: so is the part's
        took = time.monotonic() - started
        if took > SLOW_STOP_S:
            log.warning("proxy %s: stopping the %s took %.1f s", self.config.proxy_id,
                        step.name, took)  # fmt: skip

    async def _start_fleet(self) -> None:
        if self.fleet is not None:
            await self.fleet.start(PeerHandlers(self.engine.shared, self.settles))
            self.renewer.member = self.fleet.self_id  # known once its port is bound

    async def _stop_fleet(self) -> None:
        if self.fleet is not None:
            self.renewer.member = ""
            if self.settles is not None:
                # The gRPC server has stopped: no settle reaches this proxy but through
                # the links. What it renews goes to its heir before they close.
                await self.settles.hand_over()
            await self.fleet.close()
        if self.settles is not None:
            await self.settles.close()

    async def _start_grpc(self) -> None:
        config = self.config
        server = grpc.aio.server(
            options=[
                # Room for bodies over the limit, so the proxy itself can answer
                # MESSAGE_BODY_TOO_LARGE instead of gRPC's own error.
                ("grpc.max_receive_message_length", 4 * config.max_body_bytes + (1 << 20)),
                ("grpc.max_send_message_length", 4 * config.max_body_bytes + (1 << 20)),
                # Calls that reached the server before it asked for them: past 1,000 grpcio
                # cancels a rising share of them at random (3,000: all), CANCELLED before
                # any handler, which a storm of polls reaches (issue 40). The proxy's own
                # bound is receive.max_in_flight (TOO_MANY_REQUESTS, as the Apache proxy).
                *pending_calls_options(config.receive.max_in_flight),
                *([("grpc.so_reuseport", 1)] if self.reuse_port else []),
                # No grace option: after its age GOAWAY a connection keeps its open calls
                # (Telemetry streams, parked polls) as long as they last.
                *(
                    [("grpc.max_connection_age_ms", int(config.grpc_max_connection_age_s * 1000))]
                    if config.grpc_max_connection_age_s > 0
                    else []
                ),
            ]
        )
        tls = self.security.tls
        try:
            if config.security.tls_mode is TlsMode.ENFORCING and not config.security.proxy_protocol:
                # TLS clients only: gRPC takes the client port itself.
                assert tls is not None  # enforcing has a certificate, configured or made
                listen = f"{config.grpc_host}:{config.grpc_port}"
                self.grpc_port = server.add_secure_port(listen, tls.grpc_credentials())
            else:
                # The front takes the client port (and its PROXY headers) and relays to
                # these, on loopback.
                plaintext = None
                if config.security.tls_mode is not TlsMode.ENFORCING:
                    plaintext = server.add_insecure_port("127.0.0.1:0")
                secure = None
                if tls is not None:
                    secure = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
                self.front = TlsFront(
                    plaintext, secure, self._refusals(),
                    proxy_protocol=config.security.proxy_protocol,
                    count=self.metrics.front_connection,
                )  # fmt: skip
            service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, server)
            if self.client_metrics.serves:
                server.add_generic_rpc_handlers((self.client_metrics.handler(),))
            await server.start()
            if self.front is not None:
                try:
                    self.grpc_port = await self.front.start(
                        config.grpc_host, config.grpc_port, reuse_port=self.reuse_port
                    )
                except OSError as exc:  # as gRPC reports a port it cannot bind
                    raise RuntimeError(f"gRPC port: {exc}") from exc
                self.service.connections.client_of = self.front.client_of
                self.service.address_of = self.front.address_of
                self.service.send.address_of = self.front.address_of
        except BaseException:
            await server.stop(None)  # else its finaliser schedules a stop on a closed loop
            if self.front is not None:
                await self.front.close()
            raise
        advertise = f"{config.grpc_host}:{self.grpc_port}"
        self.route.advertise = config.advertise_address or advertise
        self.grpc_server = server

    async def _start_remoting(self) -> None:
        """The remoting port takes TLS and plaintext clients as the gRPC port does: behind
        a front of its own, unless TLS is off (and no PROXY header is read)."""
        port = self.remoting
        if port is None:
            return
        config = self.config
        try:
            bound = await self._remoting_listener(port, config.remoting_port or 0, None)
            for broker, wanted in config.remoting_broker_ports.items():
                self.remoting_broker_ports[broker] = await self._remoting_listener(
                    port, wanted, broker
                )
        except OSError as exc:
            await self._stop_remoting()
            raise RuntimeError(f"remoting port: {exc}") from exc
        if self.remoting_fronts:
            fronts = list(self.remoting_fronts)
            port.address_of = lambda peer: next(
                (f.address_of(peer) for f in fronts if f.relays(peer)), fronts[0].address_of(peer)
            )
        self.remoting_port = bound
        port.serving(config.grpc_host, bound, self.remoting_broker_ports)

    async def _remoting_listener(self, port: RemotingPort, wanted: int, broker: str | None) -> int:
        """One public port of the remoting port (the shared one, or ``broker``'s own): the
        port bound, behind a TLS front of its own unless TLS is off."""
        config, tls = self.config, self.security.tls
        host, mode = config.grpc_host, config.security.tls_mode
        if mode is TlsMode.DISABLED and not config.security.proxy_protocol:
            return await port.listen(
                host, wanted, reuse_port=self.reuse_port, broker=broker, direct=True
            )
        plaintext = (
            None if mode is TlsMode.ENFORCING else await port.listen("127.0.0.1", 0, broker=broker)
        )
        secure = None
        if tls is not None and mode is not TlsMode.DISABLED:
            secure = await port.listen("127.0.0.1", 0, ssl=tls.ops_context(), broker=broker)
        front = TlsFront(
            plaintext, secure, self._refusals(), proxy_protocol=config.security.proxy_protocol
        )
        self.remoting_fronts.append(front)
        return await front.start(host, wanted, reuse_port=self.reuse_port)

    async def _stop_remoting(self) -> None:
        if self.remoting is not None:
            await self.remoting.close()
        fronts, self.remoting_fronts = self.remoting_fronts, []
        await asyncio.gather(*(f.close() for f in fronts))

    def _refusals(self) -> dict[Transport, str]:
        """Why the front closes a client it does not take, as its log line says."""
        if self.config.security.tls_mode is TlsMode.DISABLED:
            tls = "security.tls_mode is disabled (plaintext clients only)"
        else:
            tls = "no TLS certificate (set security.tls_cert_file, or tls_self_signed = true)"
        return {
            Transport.TLS: f"{tls}: turn TLS off in the client, or see docs/security.md",
            Transport.PLAINTEXT: "security.tls_mode is enforcing (TLS clients only)",
        }

    async def _stop_grpc(self) -> None:
        """The drain (``proxy.drain``): the clients move away, the calls in flight end,
        the server stops."""
        if self.grpc_server is None:
            return
        await Drain(
            self.config.proxy_id,
            self.grpc_server,
            self.grpc_port,
            self.front,
            self.service,
            self.receive,
            self.engine,
            self.session,
            grace_s=min(self.config.shutdown_grace_s, 10.0),
        ).run()

    def _observe_broker_call(
        self, request: str, response: str, seconds: float, broker: str, long_polling: bool
    ) -> None:
        self.metrics.rpc(
            "remoting", request, response, seconds, broker=broker, is_long_polling=long_polling
        )

    async def stop(self) -> None:
        """Graceful stop: not ready at once, then the drain (``_stop_grpc``), then every
        other part in reverse order. Safe to call twice, and after a failed start."""
        if self.stopped:
            return
        self.stopped = True
        self.ready = False
        self.metrics.set_ready(False)
        await self._undo.aclose()  # the gRPC server first: its stop is the drain

    def status(self) -> dict[str, object]:
        status = self._status()
        security = self.security.status()
        if self.front is not None:
            security["front"] = self.front.status()
        status["security"] = security
        return status

    def _status(self) -> dict[str, object]:
        return {
            "proxy_id": self.config.proxy_id,
            "pid": os.getpid(),
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 1),
            "grpc": f"{self.config.grpc_host}:{self.grpc_port}",
            "namesrv": self.config.namesrv_addrs,
            "brokers": {
                name: {"address": c.address, "connected": c.remoting.connected}
                for name, c in self.pool.brokers.items()
            },
            "receive": self.engine.status(),
            # Open Telemetry streams, and the streams their limits refused or ended.
            "telemetry": self.session.status(),
            "registrations": None if self.registrations is None else self.registrations.status(),
            "consumer_lag": None if self.lag is None else self.lag.status(),
            "remoting": self._remoting_status(),
            # Push consumers' messages renewed here: held now, renewals made, not held.
            "renewals": {
                "held": self.renewer.size,
                "renewed": self.renewer.renewed,
                "dropped": self.renewer.dropped,
            },
            # Every task on the loop: a leak shows as a count that keeps growing.
            "tasks": len(asyncio.all_tasks()),
            "event_log": self.events.stats() if self.events is not None else None,
            "fleet": self._fleet_status(),
        }

    def _remoting_status(self) -> dict[str, object] | None:
        """The remoting port's clients and its front's connections (None: the port is off)."""
        if self.remoting is None:
            return None
        front = self.remoting_fronts[0].status() if self.remoting_fronts else None
        return {
            "port": self.remoting_port,
            "advertise": self.remoting.advertise,
            "brokers": self.remoting.broker_ports,
            "clients": self.remoting.clients,
            "front": front,
        }

    def _fleet_status(self) -> dict[str, object] | None:
        """The links, what the shared hub sent and fell back on, and the settles of
        messages another member renews (None: no fleet)."""
        if self.fleet is None or self.engine.shared is None or self.settles is None:
            return None
        shared, settles = self.engine.shared, self.settles
        return self.fleet.status() | {
            "sent": {kind.value: n for kind, n in shared.sent.items()},
            "fallbacks": shared.fallbacks,
            "settles": {
                "lent": settles.lent,
                "borrowed": settles.borrowed,
                "expired": settles.expired,
                "adopted": settles.adopted,
            },
        }
