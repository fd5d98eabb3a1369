"""A lean asyncio client of the proxy's gRPC API, making the calls the official
SimpleConsumer and Producer make. For tests and load generation; the official clients
prove interop separately (tests/interop)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID
from google.protobuf.duration_pb2 import Duration

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc

_ids = itertools.count()


def millis(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(ms)
    return d


@dataclass
class Received:
    status: int
    message: str
    messages: list[pb.Message] = field(default_factory=list)
    stream: list[str] = field(default_factory=list)  # the order of the response contents


@dataclass(frozen=True)
class ClientTls:
    """What a client over TLS trusts: ``root``, a PEM certificate (a server's self-signed
    one, or its CA), and ``name``, the name it expects the server's certificate to hold in
    place of the host it dials (the Apache proxy's test-mode certificate does not name
    127.0.0.1)."""

    root: bytes
    name: str


# The endpoints (host:port) the benchmarks' clients reach over TLS, and what they trust
# there (``bench_proxy --client-tls`` and ``bench.peer --client-tls`` fill it); a LeanClient
# of any other endpoint, made without ``tls``, is plaintext.
TLS_ENDPOINTS: dict[str, ClientTls] = {}


def certificate_name(pem: bytes) -> str:
    """The name a certificate is for: its first DNS name, else its common name."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        dns = names.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    if dns:
        return dns[0]
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not common:
        raise ValueError("the certificate names no host (no DNS name, no common name)")
    value = common[0].value
    return value.decode() if isinstance(value, bytes) else value


_DER = 2  # _ssl.ENCODING_DER: a certificate's bytes as the chain gives them


def server_tls(endpoint: str, timeout_s: float = 10.0) -> ClientTls:
    """Trust the certificates the server at ``endpoint`` presents (fetched by a TLS
    handshake that checks nothing), under the name its own holds: for a server with a
    certificate made at start, as the proxies make when none is configured (the Apache
    proxy a self-signed one, ours one signed by a throw-away authority it sends along).
    Blocking."""
    host, port = endpoint.rsplit(":", 1)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        # Public from Python 3.13 (SSLSocket.get_unverified_chain); on the SSL object before.
        owner: Any = tls
        if not hasattr(owner, "get_unverified_chain"):
            owner = owner._sslobj
        # DER bytes from the public method; certificate objects from the private one.
        ders = [c if isinstance(c, bytes) else c.public_bytes(_DER)
                for c in owner.get_unverified_chain()]  # fmt: skip
        pems = [ssl.DER_cert_to_PEM_cert(der).encode() for der in ders]
    return ClientTls(b"".join(pems), certificate_name(pems[0]))


class LeanClient:
    def __init__(
        self,
        endpoint: str,
        client_id: str | None = "lean-client",
        *,
        own_connection: bool = False,
        connection: int = 0,
        tls: ClientTls | None = None,
    ) -> None:
        """``own_connection``: a TCP connection of this client's own. gRPC otherwise shares
        one among the process's channels with the same target and options: clients of the
        same ``connection`` number share one (an option of no meaning to gRPC that only
        tells the channels apart), so a crowd of clients can spread its calls over a few
        connections, as a multi-worker proxy needs to spread them over its workers.
        ``tls``: connect over TLS (default: as ``TLS_ENDPOINTS`` says for ``endpoint``,
        plaintext when it does not name it). Channels over TLS share no connection, whatever
        their options (grpcio 1.85): each such client has its own."""
        options: list[tuple[str, int | str]] = (
            [("bench.connection", connection)] if connection else []
        )
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        tls = tls or TLS_ENDPOINTS.get(endpoint)
        if tls is None:
            self.channel = grpc.aio.insecure_channel(endpoint, options=options)
        else:
            options.append(("grpc.ssl_target_name_override", tls.name))
            credentials = grpc.ssl_channel_credentials(tls.root)
            self.channel = grpc.aio.secure_channel(endpoint, credentials, options=options)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.metadata = (("x-mq-client-id", client_id),) if client_id else ()

    async def close(self) -> None:
        await self.channel.close(None)

    async def prepare(self, group: str, topic: str, await_ms: int) -> None:
        """What a consumer does before its first receive: nothing for this client (the
        benchmarks' SettingsClient exchanges its settings over Telemetry)."""

    async def query_route(self, topic: str) -> api.QueryRouteResponse:
        return await self.stub.QueryRoute(
            api.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=self.metadata
        )

    async def send(
        self,
        topic: str,
        body: bytes,
        tag: str | None = None,
        keys=(),
        properties=None,
        message_id: str | None = None,
        message_group: str | None = None,
        lite_topic: str | None = None,
        priority: int | None = None,
    ) -> api.SendMessageResponse:
        """Send one message (the proxy chooses its queue; with ``message_group``, a FIFO
        message of that group; with ``lite_topic``, a lite message of the parent ``topic``;
        with ``priority``, a priority message)."""
        system = pb.SystemProperties(
            keys=list(keys),
            message_id=message_id or f"LEAN{next(_ids):028d}",
            body_encoding=pb.Encoding.IDENTITY,
            message_type=pb.MessageType.NORMAL,
        )
        if tag is not None:
            system.tag = tag
        if message_group is not None:
            system.message_group = message_group
            system.message_type = pb.MessageType.FIFO
        if lite_topic is not None:
            system.lite_topic = lite_topic
            system.message_type = pb.MessageType.LITE
        if priority is not None:
            system.priority = priority
            system.message_type = pb.MessageType.PRIORITY
        message = pb.Message(
            topic=pb.Resource(name=topic),
            body=body,
            system_properties=system,
            user_properties=properties or {},
        )
        return await self.stub.SendMessage(
            api.SendMessageRequest(messages=[message]), metadata=self.metadata
        )

    async def receive(
        self, group: str, topic: str, *, timeout_s: float | None = None, **options: Any
    ) -> Received:
        """One ReceiveMessage (``options``: those of ``receive_request``); the deadline is
        await + 3 s, as the official clients set it."""
        request = receive_request(group, topic, **options)
        await_ms = request.long_polling_timeout.ToMilliseconds()
        timeout = timeout_s if timeout_s is not None else await_ms / 1000 + 3
        result = Received(status=0, message="")
        async for response in self.stub.ReceiveMessage(
            request, metadata=self.metadata, timeout=timeout
        ):
            kind = response.WhichOneof("content")
            result.stream.append(kind)
            if kind == "status":
                result.status, result.message = response.status.code, response.status.message
            elif kind == "message":
                result.messages.append(response.message)
        return result

    async def ack(self, group: str, topic: str, messages) -> api.AckMessageResponse:
        """Ack, naming each lite message's lite topic as the lite consumers do."""
        entries = [
            api.AckMessageEntry(
                message_id=m.system_properties.message_id,
                receipt_handle=m.system_properties.receipt_handle,
                lite_topic=m.system_properties.lite_topic or None,
            )
            for m in messages
        ]
        return await self.stub.AckMessage(
            api.AckMessageRequest(
                group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries
            ),
            metadata=self.metadata,
        )

    async def change_invisible(
        self, group: str, topic: str, message: pb.Message, invisible_ms: int
    ) -> api.ChangeInvisibleDurationResponse:
        return await self.stub.ChangeInvisibleDuration(
            api.ChangeInvisibleDurationRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                receipt_handle=message.system_properties.receipt_handle,
                invisible_duration=millis(invisible_ms),
                message_id=message.system_properties.message_id,
                lite_topic=message.system_properties.lite_topic or None,
            ),
            metadata=self.metadata,
        )

    async def sync_lite(
        self,
        group: str,
        topic: str,
        lite_topics,
        action: pb.LiteSubscriptionAction = pb.LiteSubscriptionAction.PARTIAL_ADD,
        offset_option: pb.OffsetOption | None = None,
    ) -> api.SyncLiteSubscriptionResponse:
        """SyncLiteSubscription as the lite consumers send it (``topic``: the parent)."""
        request = api.SyncLiteSubscriptionRequest(
            action=action,
            topic=pb.Resource(name=topic),
            group=pb.Resource(name=group),
            lite_topic_set=list(lite_topics),
        )
        if offset_option is not None:
            request.offset_option.CopyFrom(offset_option)
        return await self.stub.SyncLiteSubscription(request, metadata=self.metadata)

    async def forward_to_dead_letter(
        self, group: str, topic: str, message: pb.Message, max_attempts: int
    ) -> api.ForwardMessageToDeadLetterQueueResponse:
        return await self.stub.ForwardMessageToDeadLetterQueue(
            api.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                receipt_handle=message.system_properties.receipt_handle,
                message_id=message.system_properties.message_id,
                delivery_attempt=message.system_properties.delivery_attempt,
                max_delivery_attempts=max_attempts,
            ),
            metadata=self.metadata,
        )


def receive_request(
    group: str,
    topic: str,
    *,
    await_ms: int = 5000,
    batch: int = 16,
    invisible_ms: int | None = 30_000,
    expression: str = "*",
    broker: str | None = None,
    filter_type: pb.FilterType = pb.FilterType.TAG,
    auto_renew: bool = False,
) -> api.ReceiveMessageRequest:
    """A ReceiveMessageRequest as the official SimpleConsumer builds it; ``auto_renew``: as
    a PushConsumer builds it (no invisible duration: the proxy renews)."""
    request = api.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), broker=pb.Broker(name=broker or "")
        ),
        filter_expression=pb.FilterExpression(type=filter_type, expression=expression),
        batch_size=batch,
        long_polling_timeout=millis(await_ms),
    )
    if auto_renew:
        request.auto_renew = True
    elif invisible_ms is not None:
        request.invisible_duration.CopyFrom(millis(invisible_ms))
    return request


def consumer_settings(
    client_type: pb.ClientType,
    group: str,
    topic: str,
    await_ms: int,
    endpoint: str | None = None,
) -> pb.Settings:
    """The Telemetry settings a consumer of ``group`` on ``topic`` opens its stream with, as
    the official clients write them (``endpoint``: the access point, host:port)."""
    settings = pb.Settings(
        client_type=client_type,
        request_timeout=millis(3000),
        subscription=pb.Subscription(
            group=pb.Resource(name=group),
            subscriptions=[
                pb.SubscriptionEntry(
                    topic=pb.Resource(name=topic),
                    expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
                )
            ],
            long_polling_timeout=millis(await_ms),
        ),
        user_agent=pb.UA(language=pb.Language.PYTHON, version="5.0.0", platform="linux"),
    )
    if endpoint is not None:
        host, port = endpoint.rsplit(":", 1)
        settings.access_point.CopyFrom(
            pb.Endpoints(
                scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
            )
        )
    return settings


def producer_settings(topics: list[str]) -> pb.Settings:
    """The Telemetry settings of a producer publishing to ``topics``."""
    return pb.Settings(
        client_type=pb.ClientType.PRODUCER,
        request_timeout=millis(3000),
        publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics]),
        user_agent=pb.UA(language=pb.Language.PYTHON, version="5.0.0", platform="linux"),
    )


class SettingsClient(LeanClient):
    """A LeanClient that, before its first receive, opens a Telemetry stream and sends its
    SimpleConsumer settings, and waits for the answer, as the official clients do. The
    Apache proxy takes a receive's subscription from these settings; ours answers them too,
    so every proxy gets the same calls."""

    def __init__(self, endpoint: str, client_id: str | None = "lean-client", **kw) -> None:
        super().__init__(endpoint, client_id, **kw)
        self.endpoint = endpoint
        self.metadata = (
            *self.metadata,
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.0.0"),
        )
        self._commands: asyncio.Queue | None = None
        self._telemetry: grpc.aio.StreamStreamCall | None = None

    async def prepare(self, group: str, topic: str, await_ms: int) -> None:
        await self.open(
            consumer_settings(pb.ClientType.SIMPLE_CONSUMER, group, topic, await_ms, self.endpoint)
        )

    async def open(self, settings: pb.Settings) -> None:
        """Open the Telemetry stream with ``settings`` and wait for their answer (once)."""
        if self._telemetry is not None:
            return
        self._commands = asyncio.Queue()
        self._commands.put_nowait(api.TelemetryCommand(settings=settings))
        commands = self._commands

        async def stream():
            while (command := await commands.get()) is not None:
                yield command

        self._telemetry = self.stub.Telemetry(stream(), metadata=self.metadata)
        await asyncio.wait_for(self._telemetry.read(), 15)

    async def receive(self, group: str, topic: str, **options):
        await self.prepare(group, topic, options.get("await_ms", 5000))
        return await super().receive(group, topic, **options)

    async def close(self) -> None:
        if self._telemetry is not None and self._commands is not None:
            self._commands.put_nowait(None)
            self._telemetry.cancel()
        await super().close()


class TelemetryStream:
    """One Telemetry stream of ``client_id`` over a LeanClient's channel (many streams may
    share one): ``settle`` writes one Settings and reads the command the proxy writes next
    (its answer), as an official client writes its settings at the start and again when a
    consumer subscribes anew. ``metadata``: more headers (a signature) for the stream's
    start, the only time a stream sends any."""

    def __init__(
        self,
        client: LeanClient,
        client_id: str,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._commands: asyncio.Queue[api.TelemetryCommand | None] = asyncio.Queue()
        commands = self._commands

        async def stream():
            while (command := await commands.get()) is not None:
                yield command

        headers = (
            ("x-mq-client-id", client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.0.0"),
            *metadata,
        )
        self.call = client.stub.Telemetry(stream(), metadata=headers)

    async def settle(self, settings: pb.Settings, timeout_s: float = 15) -> api.TelemetryCommand:
        self._commands.put_nowait(api.TelemetryCommand(settings=settings))
        return await asyncio.wait_for(self.call.read(), timeout_s)

    def close(self) -> None:
        """End the stream (the client's side, then the call): the proxy sees it go."""
        self._commands.put_nowait(None)
        self.call.cancel()
