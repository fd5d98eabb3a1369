"""The proxy's gRPC clients, registered with the brokers the way a 4.x client registers
itself, so that RocketMQ's own tools see them: ``mqadmin consumerConnection`` and
``producerConnection``, the dashboard's consumer and producer pages.

A broker knows a client by a HEART_BEAT on a connection: the client's id, language and
version, and the groups it produces or consumes for, with a consumer's subscriptions. It
keeps one client per group on each connection (its tables are keyed by connection), so the
proxy registers its clients over connections of their own: *slots*. A client takes the
first slot in which no other client of its groups is registered; a broker then holds as
many of this proxy's connections as the largest number of clients one group has here, not
one per client. Each registered client is named to every broker of its topics every
``HEARTBEAT_S`` (a 4.x client's pace; a broker drops a connection silent for 120 s), and at
once when it appears.

A client leaves when its last Telemetry stream here ends (it stopped, moved to another
proxy, or the proxy drains) or when it says NotifyClientTermination: an UNREGISTER_CLIENT
per group on its slot's connections. A slot nobody uses is closed, and with it the
brokers forget whatever it still named. Each proxy of a fleet registers over its own
connections, so one proxy never undoes what another registered.

A broker sends a producer group's transaction checks to any connection that named the
group, a slot's among them: the pool hands those to the transaction processor
(``BrokerPool.extra_connection``), as it does on its own connections.

A broker also asks a registered consumer for its running info on that connection (``mqadmin
consumerStatus``, the dashboard's consumer detail): the proxy answers for the client with
what it knows of it (its kind, version, start time and subscriptions; no process queues,
which a gRPC client does not have). Asked for its thread stacks too (``consumerStatus
-s``), the proxy relays a PrintThreadStackTraceCommand over the client's Telemetry stream
(``ask``) and puts the client's answer in. A request to consume a message directly
(``mqadmin consumeMessage``) gets an error that says it is not served.

What it costs a broker: per client, one HEART_BEAT every 30 s from each proxy it is
connected to; per proxy, as many connections as its largest group has clients. At most
``max_clients`` clients are registered per proxy; past it new ones are not (counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.background import start_background, stop_background
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import CURRENT_VERSION, LanguageCode, RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand

log = logging.getLogger(__name__)

HEARTBEAT_S = 30.0
# How long a client may take to send its thread stacks (a broker waits 5 s for the answer).
STACKS_TIMEOUT_S = 3.0

# The session's relay of a command to a client: (client id, command, nonce, timeout) ->
# the client's reply, or None.
Ask = Callable[[str, api.TelemetryCommand, str, float], Awaitable[api.TelemetryCommand | None]]
# Heartbeats in flight at once in a round.
CONCURRENT_CALLS = 32


class ConsumeType(enum.StrEnum):
    """How the broker lists a consumer (``consumerConnection``'s ConsumeType), as the
    Apache proxy names its gRPC clients' kinds."""

    ACTIVELY = "CONSUME_ACTIVELY"  # a simple consumer: it asks for each message
    PASSIVELY = "CONSUME_PASSIVELY"  # a push consumer: messages are handed to it


@dataclass(frozen=True)
class Subscription:
    topic: str
    expression_type: str  # TAG or SQL92
    expression: str


@dataclass(frozen=True)
class Registered:
    """What the brokers are told of one client."""

    client_id: str
    language: LanguageCode
    version: int  # RocketMQ's version ordinal (MQVersion.Version)
    version_name: str = ""  # as the client named it ("5.2.0")
    consumer_group: str = ""
    consume_type: ConsumeType = ConsumeType.ACTIVELY
    subscriptions: tuple[Subscription, ...] = ()
    producer_topics: tuple[str, ...] = ()

    @property
    def groups(self) -> frozenset[str]:
        """The groups it is listed under: its consumer group, and each topic it publishes
        to (a 5.x producer's group is its topic, as through the Apache proxy)."""
        return frozenset(filter(None, (self.consumer_group, *self.producer_topics)))

    @property
    def topics(self) -> frozenset[str]:
        return frozenset((*(s.topic for s in self.subscriptions), *self.producer_topics))

    def running_info(self, started_ms: int, stacks: str | None = None) -> bytes:
        """A consumer's ConsumerRunningInfo (JSON), as the proxy knows it: what ``mqadmin
        consumerStatus`` prints, with the client's own ``stacks`` when it gave them. No
        process queues: a gRPC client has no queues of its own."""
        properties = {
            "PROP_CLIENT_VERSION": self.version_name,
            "PROP_CLIENT_LANGUAGE": self.language.name,
            "PROP_CONSUME_TYPE": self.consume_type.value,
            "PROP_CONSUME_ORDERLY": "false",
            "PROP_CONSUMER_START_TIMESTAMP": str(started_ms),
            "PROP_SERVED_THROUGH": "rmq-notify-proxy (gRPC)",
        }
        return json.dumps(
            {
                "properties": properties,
                "subscriptionSet": [_subscription(s) for s in self.subscriptions],
                "mqTable": {},
                "mqPopTable": {},
                "statusTable": {},
                "userConsumerInfo": {},
                **({} if stacks is None else {"jstack": stacks}),
            }
        ).encode()

    def heartbeat_body(self) -> bytes:
        """The HEART_BEAT body (HeartbeatData, as JSON)."""
        consumers = []
        if self.consumer_group:
            consumers.append(
                {
                    "groupName": self.consumer_group,
                    "consumeType": self.consume_type.value,
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [_subscription(s) for s in self.subscriptions],
                    "unitMode": False,
                }
            )
        return json.dumps(
            {
                "clientID": self.client_id,
                "producerDataSet": [{"groupName": t} for t in self.producer_topics],
                "consumerDataSet": consumers,
            }
        ).encode()


def registered(
    client_id: str, language: str, version: str, settings: pb.Settings
) -> Registered | None:
    """What to register for a client whose Telemetry stream sent ``settings``, with its
    metadata's ``x-mq-language`` and ``x-mq-client-version``; None for a client of no
    group or topic."""
    code = LanguageCode.__members__.get(language.upper(), LanguageCode.OTHER)
    if settings.WhichOneof("pub_sub") == "subscription":
        sub = settings.subscription
        if not sub.group.name:
            return None
        simple = (pb.ClientType.SIMPLE_CONSUMER, pb.ClientType.LITE_SIMPLE_CONSUMER)
        kind = ConsumeType.ACTIVELY if settings.client_type in simple else ConsumeType.PASSIVELY
        subscriptions = tuple(
            Subscription(
                s.topic.name,
                "SQL92" if s.expression.type == pb.FilterType.SQL else "TAG",
                s.expression.expression or "*",
            )
            for s in sub.subscriptions
        )
        return Registered(
            client_id, code, version_ordinal(version), version, sub.group.name, kind,
            subscriptions,
        )  # fmt: skip
    topics = tuple(t.name for t in settings.publishing.topics if t.name)
    if not topics:
        return None
    return Registered(client_id, code, version_ordinal(version), version, producer_topics=topics)


def version_ordinal(version: str) -> int:
    """A client version ("5.2.0") as RocketMQ's version ordinal: V5_0_0 is 413, then two
    per patch release (each has its SNAPSHOT before it), to V5_9_9 (611); later majors are
    HIGHER_VERSION (612). Unreadable: the proxy's own."""
    parts = version.split("-")[0].split(".")
    try:
        major, minor, patch = (int(p) for p in [*parts, "0", "0"][:3])
    except ValueError:
        return CURRENT_VERSION
    if major > 5:
        return 612
    if major == 5 and 0 <= minor <= 9 and 0 <= patch <= 9:
        return 413 + 2 * (10 * minor + patch)
    return CURRENT_VERSION


def _subscription(s: Subscription) -> dict[str, object]:
    tags = [] if s.expression_type != "TAG" or s.expression.strip() == "*" else [
        t.strip() for t in s.expression.split("||") if t.strip()
    ]  # fmt: skip
    return {
        "classFilterMode": False,
        "topic": s.topic,
        "subString": s.expression,
        "tagsSet": tags,
        "codeSet": [_java_hash(t) for t in tags],
        "subVersion": int(time.time() * 1000),
        "expressionType": s.expression_type,
    }


def _java_hash(text: str) -> int:
    """Java's String.hashCode (the tag codes a subscription carries)."""
    data = text.encode("utf-16-be")  # Java strings are UTF-16 code units
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@dataclass
class _Slot:
    """A set of connections, one per broker, each naming at most one client per group."""

    groups: set[str] = field(default_factory=set)
    clients: set[str] = field(default_factory=set)
    connections: dict[str, BrokerClient] = field(default_factory=dict)  # by broker address


class Registrations:
    """The clients registered with the brokers on this proxy's behalf. ``add`` and
    ``remove`` are called from the Telemetry handlers; one background task (``start``,
    ``close``) talks to the brokers."""

    def __init__(
        self,
        pool: BrokerPool,
        *,
        max_clients: int,
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = 3.0,
    ) -> None:
        self.pool = pool
        self.max_clients = max_clients
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self._clients: dict[str, Registered] = {}
        self._since_ms: dict[str, int] = {}  # when each client was first registered
        self._slot_of: dict[str, int] = {}
        self._slots: list[_Slot] = []
        # Brokers (by address) each client was named to, for its unregistration.
        self._named_to: dict[str, set[str]] = {}
        self._new: set[str] = set()  # to heartbeat at once
        self._leaving: list[tuple[Registered, int]] = []
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.refused = 0  # clients past max_clients
        self.heartbeats_sent = 0
        self.heartbeats_failed = 0
        self.rounds = 0  # full heartbeat rounds done
        # Relays a command to a client's Telemetry stream and awaits its reply (the
        # session's ``ask``); None: thread stacks are not asked for.
        self.ask: Ask | None = None

    def start(self) -> None:
        self._task = start_background(self._run(), name="client-registrations", log=log)

    async def close(self) -> None:
        """Stop, and close every slot: the brokers forget all the clients at once."""
        task, self._task = self._task, None
        await stop_background(task)
        for slot in self._slots:
            for connection in slot.connections.values():
                await connection.close()
        self._slots.clear()

    def status(self) -> dict[str, int]:
        return {
            "clients": len(self._clients),
            "slots": len(self._slots),
            "connections": sum(len(s.connections) for s in self._slots),
            "refused": self.refused,
            "heartbeats_sent": self.heartbeats_sent,
            "heartbeats_failed": self.heartbeats_failed,
            "rounds": self.rounds,
        }

    def consumed(self) -> set[tuple[str, str]]:
        """The (group, topic) pairs of the consumers registered here."""
        return {
            (c.consumer_group, s.topic)
            for c in self._clients.values()
            if c.consumer_group
            for s in c.subscriptions
        }

    # -- called by the Telemetry handlers --------------------------------------------------

    def add(self, client: Registered) -> None:
        """Register ``client`` (again, when its settings change)."""
        before = self._clients.get(client.client_id)
        if before == client:
            return
        if before is not None:
            self.remove(client.client_id)
        if len(self._clients) >= self.max_clients:
            self.refused += 1
            return
        index = next((i for i, s in enumerate(self._slots) if not (s.groups & client.groups)), None)
        if index is None:
            self._slots.append(_Slot())
            index = len(self._slots) - 1
        slot = self._slots[index]
        slot.groups |= client.groups
        slot.clients.add(client.client_id)
        self._clients[client.client_id] = client
        self._since_ms.setdefault(client.client_id, int(time.time() * 1000))
        self._slot_of[client.client_id] = index
        self._new.add(client.client_id)
        self._kick.set()

    def remove(self, client_id: str) -> None:
        """Unregister ``client_id`` (it ended its last stream here, or said it terminates)."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return
        self._since_ms.pop(client_id, None)
        index = self._slot_of.pop(client_id)
        slot = self._slots[index]
        slot.groups -= client.groups
        slot.clients.discard(client_id)
        self._new.discard(client_id)
        self._leaving.append((client, index))
        self._kick.set()

    # -- the brokers' side ------------------------------------------------------------------

    async def _run(self) -> None:
        next_round = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), max(0.0, next_round - time.monotonic()))
            self._kick.clear()
            await self._unregister_leaving()
            if time.monotonic() >= next_round:
                next_round = time.monotonic() + self.heartbeat_s
                self._new.clear()
                await self._heartbeat(list(self._clients.values()))
                self.rounds += 1
            elif self._new:
                new, self._new = self._new, set()
                await self._heartbeat([self._clients[c] for c in new if c in self._clients])
            await self._close_idle_slots()

    async def _heartbeat(self, clients: Iterable[Registered]) -> None:
        gate = asyncio.Semaphore(CONCURRENT_CALLS)

        async def one(client: Registered) -> None:
            async with gate:
                await self._heartbeat_one(client)

        await asyncio.gather(*(one(c) for c in clients))

    async def _heartbeat_one(self, client: Registered) -> None:
        index = self._slot_of.get(client.client_id)
        if index is None:
            return
        for name, address in await self._brokers_of(client):
            if self._slot_of.get(client.client_id) != index:
                return  # it left meanwhile
            connection = self._connection(index, name, address)
            try:
                await connection.heartbeat_for(
                    client.heartbeat_body(), client.language, client.version, self.timeout_s
                )
            except RemotingError as exc:
                self.heartbeats_failed += 1
                log.info("heartbeat of client %s to %s failed: %s", client.client_id, name, exc)
                continue
            self.heartbeats_sent += 1
            self._named_to.setdefault(client.client_id, set()).add(address)

    async def _brokers_of(self, client: Registered) -> list[tuple[str, str]]:
        found: dict[str, str] = {}
        for topic in sorted(client.topics):
            try:
                route = await self.pool.route(topic)
            except (TopicNotFound, RemotingError):
                continue
            for broker in route.brokers:
                found[broker.address] = broker.name
        return [(name, address) for address, name in found.items()]

    def _connection(self, index: int, name: str, address: str) -> BrokerClient:
        slot = self._slots[index]
        connection = slot.connections.get(address)
        if connection is None:
            connection = self.pool.extra_connection(name, address, self.on_broker_request)
            slot.connections[address] = connection
        return connection

    def on_broker_request(
        self, cmd: RemotingCommand
    ) -> RemotingCommand | Coroutine[Any, Any, RemotingCommand] | None:
        """A broker's request to one of the registered clients, on a slot's connection
        (the pool's own codes, a transaction check among them, never come here)."""
        fields = cmd.ext_fields or {}
        if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            client = self._clients.get(fields.get("clientId", ""))
            if client is None or client.consumer_group != fields.get("consumerGroup"):
                return cmd.make_response(
                    ResponseCode.SYSTEM_ERROR,
                    remark=f"client {fields.get('clientId')} of group "
                    f"{fields.get('consumerGroup')} is not connected to this proxy",
                )
            since = self._since_ms.get(client.client_id, 0)
            if fields.get("jstackEnable") == "true" and self.ask is not None:
                return self._running_info_with_stacks(cmd, client, since)
            return cmd.make_response(ResponseCode.SUCCESS, body=client.running_info(since))
        if cmd.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR,
                remark="consuming a message directly is not served for gRPC clients of "
                "rmq-notify-proxy",
            )
        return None  # NOTIFY_CONSUMER_IDS_CHANGED and the like: nothing to do

    async def _running_info_with_stacks(
        self, cmd: RemotingCommand, client: Registered, since_ms: int
    ) -> RemotingCommand:
        assert self.ask is not None
        nonce = uuid.uuid4().hex
        asked = api.TelemetryCommand(
            print_thread_stack_trace_command=api.PrintThreadStackTraceCommand(nonce=nonce)
        )
        reply = await self.ask(client.client_id, asked, nonce, STACKS_TIMEOUT_S)
        if reply is None:
            stacks = "the client did not answer the proxy's request for its thread stacks"
        else:
            stacks = reply.thread_stack_trace.thread_stack_trace
        body = client.running_info(since_ms, stacks)
        return cmd.make_response(ResponseCode.SUCCESS, body=body)

    async def _unregister_leaving(self) -> None:
        leaving, self._leaving = self._leaving, []
        for client, index in leaving:
            named = self._named_to.pop(client.client_id, set())
            if index >= len(self._slots):
                continue
            slot = self._slots[index]
            for address in named:
                connection = slot.connections.get(address)
                if connection is None:
                    continue
                for group in sorted(client.groups):
                    consumer = group == client.consumer_group
                    try:
                        await connection.unregister_client(
                            client.client_id,
                            consumer_group=group if consumer else None,
                            producer_group=None if consumer else group,
                            timeout=self.timeout_s,
                        )
                    except RemotingError as exc:
                        log.info(
                            "unregistering client %s from %s failed: %s",
                            client.client_id, connection.name, exc,
                        )  # fmt: skip

    async def _close_idle_slots(self) -> None:
        """Close the slots at the end of the list that no client uses (their connections
        with them); a slot in the middle stays for the next client that fits it."""
        while self._slots and not self._slots[-1].clients:
            slot = self._slots.pop()
            for connection in slot.connections.values():
                await connection.close()
