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

Who is registered: only what the guard allowed (``proxy.api.session``): a consumer's
group and topics if its user may subscribe the group to each of them, a producer's topics
if it may publish to each; the session authorizes every Settings, the first and each later
one, before it comes here. Later Settings replace the client's registration.

What it may cost, bounded, since a client chooses its id, its groups and its topics:

- ``max_clients`` clients registered per proxy process (``max_registered_clients``);
- ``max_per_group`` of them per group (``max_registered_per_group``): a group's clients
  each need a slot of their own, so this bounds the slots one group makes;
- ``MAX_TOPICS`` topics per client (each is a route to follow every round);
- ``max_connections`` slot connections, taken from the process's open-files budget
  (``proxy.descriptors``) that the fronts' relays share: a quarter of it by default
  (``CONNECTION_SHARE``), so registrations never crowd out the clients' own connections,
  and never past what the budget has left.

A client past a bound is served as any other but not registered (or no longer, when its
later Settings passed one): counted by ``Refusal`` (``on_refused``, on ``/metrics``) and
logged at most once a minute. What it costs a broker: per client, one HEART_BEAT every
30 s from each proxy it is connected to; per proxy, as many connections as its largest
group has clients, at most ``max_connections`` over all brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.background import start_background, stop_background
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.descriptors import DescriptorBudget, process_budget
from proxy.observability.log_every import LogEvery
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
# The clients of one group registered per proxy process, by default (a group's clients each
# take a slot of their own: this bounds the slots, and the connections, one group makes).
MAX_PER_GROUP = 1_000
# Topics one client is registered with at most (subscriptions and producer topics): each is
# a route the heartbeat round follows, and a group the broker lists.
MAX_TOPICS = 100
# The share of the process's open-files budget the slot connections may hold: the rest is
# the clients' own connections' (the fronts' relays).
CONNECTION_SHARE = 0.25
# At most one line a minute about the clients not registered; the lines between counted.
REFUSAL_LOG_EVERY_S = 60.0


class Refusal(enum.StrEnum):
    """Why a client the guard allowed is served but not registered: the ``reason`` label
    of ``rocketmq_proxy_client_registrations_refused_total``, a fixed set."""

    CLIENTS = "clients"  # max_clients are registered
    GROUP = "group"  # one of its groups has max_per_group registered
    TOPICS = "topics"  # it names more than MAX_TOPICS topics
    CONNECTIONS = "connections"  # its slot would pass max_connections, or the budget


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
    # The broker addresses a descriptor is held for (opened or to open), from the budget.
    reserved: set[str] = field(default_factory=set)


class Registrations:
    """The clients registered with the brokers on this proxy's behalf. ``add`` and
    ``remove`` are called from the Telemetry handlers; one background task (``start``,
    ``close``) talks to the brokers."""

    def __init__(
        self,
        pool: BrokerPool,
        *,
        max_clients: int,
        max_per_group: int = MAX_PER_GROUP,
        budget: DescriptorBudget | None = None,
        max_connections: int | None = None,
        on_refused: Callable[[str], None] | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        timeout_s: float = 3.0,
    ) -> None:
        """``budget``: where slot connections take their descriptors (None: the process's,
        which the fronts share); ``max_connections``: the most they hold (None:
        ``CONNECTION_SHARE`` of the budget); ``on_refused(reason)``: told of each client
        not registered (``ProxyMetrics.registration_refused``)."""
        self.pool = pool
        self.max_clients = max_clients
        self.max_per_group = max_per_group
        self.budget = process_budget() if budget is None else budget
        self.max_connections = (
            int(self.budget.total * CONNECTION_SHARE)
            if max_connections is None
            else max_connections
        )
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self._clients: dict[str, Registered] = {}
        self._since_ms: dict[str, int] = {}  # when each client was first registered
        self._slot_of: dict[str, int] = {}
        self._slots: list[_Slot] = []
        self._per_group: Counter[str] = Counter()  # clients registered per group
        self._reserved = 0  # descriptors the slots hold of the budget
        # Brokers (by address) each client was named to, for its unregistration.
        self._named_to: dict[str, set[str]] = {}
        self._new: set[str] = set()  # to heartbeat at once
        self._leaving: list[tuple[Registered, int]] = []
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.refusals: Counter[Refusal] = Counter()  # clients not registered, by reason
        self._on_refused = on_refused or (lambda reason: None)
        self._refusals_log = LogEvery(log, REFUSAL_LOG_EVERY_S)
        self.heartbeats_sent = 0
        self.heartbeats_failed = 0
        # Heartbeats not sent: the broker joined a client's route after it was registered,
        # and its slot got no descriptor for a connection to it.
        self.heartbeats_refused = 0
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
        slots, self._slots = self._slots, []
        for slot in slots:
            await self._close_slot(slot)

    @property
    def refused(self) -> int:
        """Clients not registered (past a bound), all reasons."""
        return sum(self.refusals.values())

    def status(self) -> dict[str, object]:
        """The clients registered, the slots and their connections (open, and held of the
        budget: ``reserved``, at most ``max_connections``), and what was refused."""
        return {
            "clients": len(self._clients),
            "groups": len(self._per_group),
            "slots": len(self._slots),
            "connections": sum(len(s.connections) for s in self._slots),
            "reserved": self._reserved,
            "max_clients": self.max_clients,
            "max_per_group": self.max_per_group,
            "max_connections": self.max_connections,
            "refused": self.refused,
            "refused_by": {r.value: self.refusals[r] for r in Refusal},
            "heartbeats_sent": self.heartbeats_sent,
            "heartbeats_failed": self.heartbeats_failed,
            "heartbeats_refused": self.heartbeats_refused,
            "rounds": self.rounds,
        }

    def clients_of(self, group: str) -> int:
        """The clients of ``group`` registered here."""
        return self._per_group.get(group, 0)

    def consumed(self) -> set[tuple[str, str]]:
        """The (group, topic) pairs of the consumers registered here."""
        return {
            (c.consumer_group, s.topic)
            for c in self._clients.values()
            if c.consumer_group
            for s in c.subscriptions
        }

    # -- called by the Telemetry handlers --------------------------------------------------

    async def add(self, client: Registered) -> Refusal | None:
        """Register ``client``, or again with its new settings, which replace the old ones;
        the bound that refuses it, if one does: then it is not registered (any more).
        The guard has allowed what it names (the session asks it)."""
        if self._clients.get(client.client_id) == client:
            return None
        self.remove(client.client_id)
        refusal = self._over(client)
        if refusal is None:
            brokers = await self._brokers_of(client)  # the routes, before the slot
            self.remove(client.client_id)  # added meanwhile, by another of its streams
            refusal = self._over(client) or self._place(client, {a for _, a in brokers})
        if refusal is not None:
            self._refuse(client, refusal)
        return refusal

    def _over(self, client: Registered) -> Refusal | None:
        """The count that ``client`` (not registered now) would pass, if any."""
        if len(client.subscriptions) + len(client.producer_topics) > MAX_TOPICS:
            return Refusal.TOPICS
        if len(self._clients) >= self.max_clients:
            return Refusal.CLIENTS
        if any(self._per_group[g] >= self.max_per_group for g in client.groups):
            return Refusal.GROUP
        return None

    def _place(self, client: Registered, addresses: set[str]) -> Refusal | None:
        """Put ``client`` in the first slot that has none of its groups and holds (or can
        get from the budget) a connection to each broker of its topics; a new slot if
        none does. CONNECTIONS if the budget has no room for one."""
        index = None
        for i, slot in enumerate(self._slots):
            if not (slot.groups & client.groups) and self._reserve(slot, addresses):
                index = i
                break
        if index is None:
            slot = _Slot()
            if not self._reserve(slot, addresses):
                return Refusal.CONNECTIONS
            self._slots.append(slot)
            index = len(self._slots) - 1
        slot = self._slots[index]
        slot.groups |= client.groups
        slot.clients.add(client.client_id)
        self._per_group.update(client.groups)
        self._clients[client.client_id] = client
        self._since_ms.setdefault(client.client_id, int(time.time() * 1000))
        self._slot_of[client.client_id] = index
        self._new.add(client.client_id)
        self._kick.set()
        return None

    def _reserve(self, slot: _Slot, addresses: Iterable[str]) -> bool:
        """Hold a descriptor for each of ``addresses`` the slot has none for: within
        ``max_connections`` and the budget, or none at all."""
        needed = set(addresses) - slot.reserved
        if not needed:
            return True
        if self._reserved + len(needed) > self.max_connections:
            return False
        if not self.budget.take(len(needed)):
            return False
        self._reserved += len(needed)
        slot.reserved |= needed
        return True

    def _refuse(self, client: Registered, refusal: Refusal) -> None:
        self.refusals[refusal] += 1
        self._on_refused(refusal.value)
        self._refusals_log.warning(
            "client %r is served but not registered with the brokers: %s; %d refused so far",
            client.client_id, self._why(client, refusal), self.refused,
        )  # fmt: skip

    def _why(self, client: Registered, refusal: Refusal) -> str:
        if refusal is Refusal.TOPICS:
            topics = len(client.subscriptions) + len(client.producer_topics)
            return f"it names {topics} topics, more than {MAX_TOPICS}"
        if refusal is Refusal.CLIENTS:
            return f"{self.max_clients} clients are registered (max_registered_clients)"
        if refusal is Refusal.GROUP:
            group = next(
                g for g in sorted(client.groups) if self._per_group[g] >= self.max_per_group
            )
            return (
                f"group {group!r} has {self.max_per_group} clients registered "
                f"(max_registered_per_group)"
            )
        return (
            f"its slot needs connections to brokers the registrations have no descriptors "
            f"for ({self._reserved} held of their {self.max_connections}; "
            f"{self.budget.held} of the process's {self.budget.total} held in all)"
        )

    def remove(self, client_id: str) -> None:
        """Unregister ``client_id`` (it ended its last stream here, or said it terminates,
        or its new settings are refused)."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return
        self._since_ms.pop(client_id, None)
        self._per_group.subtract(client.groups)
        for group in client.groups:
            if self._per_group[group] <= 0:
                del self._per_group[group]
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
            if connection is None:
                self.heartbeats_refused += 1
                continue
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

    def _connection(self, index: int, name: str, address: str) -> BrokerClient | None:
        """The slot's connection to a broker, opened now if it is not yet; None when it has
        no descriptor for it and the budget has none to give (a broker that joined a
        client's route after it was placed)."""
        slot = self._slots[index]
        connection = slot.connections.get(address)
        if connection is None:
            if not self._reserve(slot, (address,)):
                return None
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
            await self._close_slot(self._slots.pop())

    async def _close_slot(self, slot: _Slot) -> None:
        """Close a slot's connections and give their descriptors back to the budget."""
        self._reserved -= len(slot.reserved)
        self.budget.give(len(slot.reserved))
        slot.reserved.clear()
        connections = list(slot.connections.values())
        slot.connections.clear()
        for connection in connections:
            await connection.close()
