"""The brokers behind the proxy: topic routes from the name server and one client per broker.

Routes are cached for ``route_ttl_s`` and then refreshed in the background while the old one
keeps serving; concurrent look-ups of one topic share a request, and when the name server
cannot be reached a stale route keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from proxy.background import shared_lookup
from proxy.message_types import MessageType, topic_message_type
from proxy.remoting import fastjson
from proxy.remoting.broker_client import BrokerClient, CallObserver
from proxy.remoting.client import (
    RemotingClient,
    RemotingError,
    RequestHook,
    ServerAnswer,
    ServerHandler,
)
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand

log = logging.getLogger(__name__)

# The Apache proxy's bound on its topic-config look-up (ClusterTopicConfigCacheLoader).
TOPIC_CONFIG_TIMEOUT_S = 3.0
# After a failed refresh of a stale route, seconds before the next look-up (at most the TTL).
REFRESH_RETRY_S = 2.0

PERM_WRITE = 2
PERM_READ = 4


class TopicNotFound(Exception):
    """No broker serves the topic."""


@dataclass(frozen=True, slots=True)
class BrokerRoute:
    name: str
    address: str
    read_queues: int
    write_queues: int
    perm: int

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ) and self.read_queues > 0

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE) and self.write_queues > 0


@dataclass(frozen=True, slots=True)
class RouteQueue:
    """One queue of a topic on one broker, as listed to clients."""

    broker: BrokerRoute
    queue_id: int  # the broker's own queue id

    @property
    def readable(self) -> bool:
        return self.broker.readable and self.queue_id < self.broker.read_queues

    @property
    def writable(self) -> bool:
        return self.broker.writable and self.queue_id < self.broker.write_queues


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    brokers: tuple[BrokerRoute, ...]
    # The topic's message.type, read from one of its brokers with the route (what it accepts).
    message_type: MessageType = MessageType.UNKNOWN

    @property
    def readable(self) -> list[BrokerRoute]:
        return [b for b in self.brokers if b.readable]

    @property
    def writable(self) -> list[BrokerRoute]:
        return [b for b in self.brokers if b.writable]

    @property
    def queues(self) -> list[RouteQueue]:
        """Every queue, interleaved across the brokers (queue 0 of each broker in name order,
        then queue 1, ...). A client names a queue by its position here (QueryRoute lists
        them so), which says both the broker and its queue. Interleaved because the official
        clients take queues round-robin: grouped by broker, a SimpleConsumer would name the
        same broker for as many receives in a row as it has queues, and a coupled poll (which
        pops only the broker named) would leave the other brokers' messages waiting. Sends
        take the writable queues of this listing in turn, so they spread over the brokers
        alike (``processor/producer.py``)."""
        depth = {b.name: max(b.read_queues, b.write_queues) for b in self.brokers}
        return [
            RouteQueue(broker, queue_id)
            for queue_id in range(max(depth.values(), default=0))
            for broker in self.brokers
            if queue_id < depth[broker.name]
        ]


def master_address(broker: Mapping[str, Any]) -> str | None:
    """A BrokerData's master address (broker id 0), whether its key was written as a bare
    number (fastjson) or as a string (standard JSON)."""
    addresses = broker.get("brokerAddrs") or {}
    return addresses.get(0) or addresses.get("0") or None


def cluster_brokers(body: bytes) -> dict[str, str]:
    """A name server's ClusterInfo (GET_BROKER_CLUSTER_INFO) -> each broker's master
    address, by broker name."""
    table = fastjson.loads(body).get("brokerAddrTable") or {}
    return {name: m for name, b in table.items() if (m := master_address(b))}


def route_masters(route: Mapping[str, Any]) -> dict[str, str]:
    """A TopicRouteData's master address of each broker, by broker name."""
    brokers = route.get("brokerDatas") or []
    return {b["brokerName"]: m for b in brokers if (m := master_address(b))}


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """TopicRouteData JSON -> the master brokers serving ``topic``."""
    data = orjson.loads(body)
    masters = route_masters(data)
    brokers = [
        BrokerRoute(
            name=q["brokerName"],
            address=masters[q["brokerName"]],
            read_queues=int(q.get("readQueueNums", 0)),
            write_queues=int(q.get("writeQueueNums", 0)),
            perm=int(q.get("perm", 0)),
        )
        for q in data.get("queueDatas", [])
        if q.get("brokerName") in masters
    ]
    return TopicRoute(topic, tuple(sorted(brokers, key=lambda b: b.name)))


class BrokerPool:
    """Routes and broker clients shared by everything in one proxy."""

    def __init__(
        self,
        namesrv_addrs: list[str],
        route_ttl_s: float = 30.0,
        observer: CallObserver | None = None,
        timeout_s: float = 3.0,
        request_hook: RequestHook | None = None,
        not_found_grace_s: float = 120.0,
    ) -> None:
        """``request_hook`` signs every request to brokers and name servers (ACL).
        ``not_found_grace_s``: how long past its TTL a route is still used when the name
        server says the topic does not exist (a restarted name server, brokers not yet
        registered again)."""
        if not namesrv_addrs:
            raise ValueError("at least one name server address is needed")
        self._request_hook = request_hook
        self._namesrvs = [RemotingClient(addr, request_hook=request_hook) for addr in namesrv_addrs]
        self._namesrv_turn = itertools.cycle(range(len(self._namesrvs)))
        self._ttl = route_ttl_s
        self._grace = not_found_grace_s
        self._timeout = timeout_s
        self._observer = observer
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        # When the name server last listed each (topic, broker) (``_with_unregistered``).
        self._listed: dict[tuple[str, str], float] = {}
        self._lookups: dict[str, asyncio.Future[TopicRoute]] = {}
        # When a topic's stale route may be looked up again after a failed refresh.
        self._retry_at: dict[str, float] = {}
        self._brokers: dict[str, BrokerClient] = {}
        self._retired: list[BrokerClient] = []
        # Clients of brokers known from the name server's list of the cluster only, for
        # admin requests (``ask_any_broker``) before any route named them.
        self._listed_clients: dict[str, BrokerClient] = {}
        self._cluster_listing: dict[str, asyncio.Future[None]] = {}  # its one look-up
        # Requests brokers send us (a transaction check, a lite unsubscribe), by request
        # code; each handler gets the broker's name (``serve``).
        self._served: dict[int, Callable[[str, RemotingCommand], RemotingCommand | None]] = {}
        self._connect_listeners: list[Callable[[str], None]] = []

    async def route(self, topic: str) -> TopicRoute:
        """The route of ``topic``; raises TopicNotFound, or RemotingError with no route known.

        A route past its TTL is still answered at once while a look-up refreshes it in the
        background (``_refresh``): a request never waits on the name server for a topic it
        has a route of, so a name server that is down costs no client its deadline."""
        cached = self._routes.get(topic)
        if cached is None:
            return await shared_lookup(self._lookups, topic, lambda: self._fetch(topic))
        now = time.monotonic()
        if now - cached[0] >= self._ttl and now >= self._retry_at.get(topic, 0.0):
            self._refresh(topic)
        return cached[1]

    def _refresh(self, topic: str) -> None:
        """Look ``topic``'s route up again without waiting; ``_refreshed`` sees the end. The
        look-up is shared with callers that have no route, and ``close`` cancels it."""
        lookup = shared_lookup(self._lookups, topic, lambda: self._fetch(topic))
        lookup.add_done_callback(functools.partial(self._refreshed, topic))

    def _refreshed(self, topic: str, lookup: asyncio.Future[TopicRoute]) -> None:
        if lookup.cancelled():
            return
        exc = lookup.exception()
        if exc is None:
            self._retry_at.pop(topic, None)
            return
        # The stale route stands; the next look-up waits a little, else every request of
        # the topic started one while the name server was down or had forgotten the topic
        # (a thousand look-ups, and as many log lines, per name-server restart in the soak).
        self._retry_at[topic] = time.monotonic() + min(self._ttl, REFRESH_RETRY_S)
        if isinstance(exc, RemotingError):
            log.warning("name server unreachable; using the stale route of %s: %s", topic, exc)
        elif isinstance(exc, TopicNotFound):
            # A name server just restarted knows no topic until the brokers register again
            # (a real broker every 30 s): keep a route seen lately rather than fail every
            # client with TOPIC_NOT_FOUND meanwhile (docs/reliability.md, "At-least-once
            # delivery").
            # Past the grace the topic is taken as gone: the next request looks it up.
            cached = self._routes.get(topic)
            if cached is not None and time.monotonic() - cached[0] >= self._ttl + self._grace:
                log.warning("name server does not know %s: its route is dropped", topic)
                del self._routes[topic]
            else:
                log.warning("name server does not know %s; using its stale route", topic)
        else:
            log.error("route of %s: %r", topic, exc, exc_info=exc)

    async def _fetch(self, topic: str) -> TopicRoute:
        client = self._namesrvs[next(self._namesrv_turn)]
        request = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        response = await client.invoke(request, self._timeout)
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            raise TopicNotFound(topic)
        if response.code != ResponseCode.SUCCESS:
            raise RemotingError(f"route of {topic}: name server answered {response.code}")
        listed = parse_route(topic, response.body)
        route = self._with_unregistered(listed)
        if not route.brokers:
            raise TopicNotFound(topic)
        now = time.monotonic()
        for broker in listed.brokers:
            self._listed[(topic, broker.name)] = now
        for broker in route.brokers:
            self._client_for(broker)
        route = replace(route, message_type=await self._message_type(route))
        self._routes[topic] = (time.monotonic(), route)
        return route

    async def ask_name_server(self, request: RemotingCommand) -> RemotingCommand:
        """A name server's answer to ``request`` (a copy is sent, signed as the pool's are);
        the name servers are asked in turn. Raises RemotingError."""
        client = self._namesrvs[next(self._namesrv_turn)]
        return await client.invoke(replace(request, ext_fields=dict(request.fields)), self._timeout)

    def _with_unregistered(self, route: TopicRoute) -> TopicRoute:
        """``route`` with the brokers the name server listed for the topic within TTL +
        grace and lists no more, while our connection to each is up. A restarted name server
        learns the brokers one by one as they register again (a real broker every 30 s), so
        for a while it answers with some of them: dropping the others would move every
        message group hashed among the queues to another queue, and a FIFO group's next
        message could be consumed before the last ones sent to its old queue
        (docs/reliability.md, "FIFO order across a broker crash"). A broker that is really
        gone closes its connection, and one the operator took the topic off leaves after
        the grace.

        A FIFO topic keeps such a broker even when its connection is down: a broker that
        crashed leaves the name server's route at once, and its message groups would move to
        other queues and be consumed before what they left on it (the soak saw it after
        broker SIGKILLs). Kept, their sends fail until it is back, or until the grace ends
        and they move: order first for a short outage, as RocketMQ's order topic
        configuration (``orderTopicConf``) does for good."""
        listed = {b.name for b in route.brokers}
        cached = self._routes.get(route.topic)
        if cached is None:
            return route
        recent = set(self.recent_brokers(route.topic))
        ordered = cached[1].message_type is MessageType.FIFO
        kept = [
            b
            for b in cached[1].brokers
            if b.name not in listed and b.name in recent and (ordered or self._connected(b.name))
        ]
        if not kept:
            return route
        log.warning(
            "name server lists %s without %s (%s): kept in its route",
            route.topic,
            ", ".join(b.name for b in kept),
            "a FIFO topic" if ordered else "still connected",
        )
        return replace(route, brokers=tuple(sorted([*route.brokers, *kept], key=lambda b: b.name)))

    def _connected(self, broker: str) -> bool:
        client = self._brokers.get(broker)
        return client is not None and client.remoting.connected

    def recent_brokers(self, topic: str) -> list[str]:
        """The brokers the name server listed for ``topic`` within TTL + grace, whether it
        lists them now or not: a broker that was SIGKILLed leaves the route at once, and
        when it comes back the route lists it again only at its next refresh."""
        horizon = time.monotonic() - (self._ttl + self._grace)
        return sorted(b for (t, b), seen in self._listed.items() if t == topic and seen > horizon)

    async def _message_type(self, route: TopicRoute) -> MessageType:
        """The topic's ``message.type`` from the topic config of one of its brokers, as the
        Apache proxy learns it (ClusterMetadataService: GET_TOPIC_CONFIG of one broker; it
        caches it for 20 s, we for as long as the route). A broker that cannot answer leaves
        it UNKNOWN until the next refresh rather than fail the route: what a topic accepts
        only narrows what clients may send, and the broker itself checks no type. A broker
        that is connected is asked first, and the type known before stands while none
        answers: a FIFO topic keeps a crashed broker in its route (``_with_unregistered``)
        only while its type is known."""
        candidates = route.writable or list(route.brokers)
        broker = next((b for b in candidates if self._connected(b.name)), candidates[0])
        try:
            config = await self._client_for(broker).topic_config(
                route.topic, min(self._timeout, TOPIC_CONFIG_TIMEOUT_S)
            )
        except RemotingError as exc:
            log.warning("topic config of %s from %s: %s", route.topic, broker.name, exc)
            cached = self._routes.get(route.topic)
            return MessageType.UNKNOWN if cached is None else cached[1].message_type
        return topic_message_type(config)

    def _client_for(self, broker: BrokerRoute) -> BrokerClient:
        client = self._brokers.get(broker.name)
        if client is None or client.address != broker.address:
            if client is not None:
                # The broker moved; calls in flight on the old client may still finish.
                self._retired.append(client)
            client = BrokerClient(
                broker.name,
                broker.address,
                observer=self._observer,
                request_hook=self._request_hook,
                server_handler=functools.partial(self._on_server_request, broker.name),
                on_connect=functools.partial(self._on_connect, broker.name),
            )
            self._brokers[broker.name] = client
        return client

    def serve(
        self, code: int, handler: Callable[[str, RemotingCommand], RemotingCommand | None]
    ) -> None:
        """Hand requests of ``code`` that brokers send on our connections to ``handler``."""
        self._served[code] = handler

    def on_connect(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(broker name)`` each time a connection to a broker is made: the
        first, and each after a loss (a broker restarted knows nothing of us)."""
        self._connect_listeners.append(listener)

    def _on_connect(self, broker: str) -> None:
        for listener in self._connect_listeners:
            listener(broker)

    def _on_server_request(self, broker: str, cmd: RemotingCommand) -> RemotingCommand | None:
        handler = self._served.get(cmd.code)
        return None if handler is None else handler(broker, cmd)

    def extra_connection(
        self, name: str, address: str, server_handler: ServerHandler | None = None
    ) -> BrokerClient:
        """A connection of its own to broker ``name`` at ``address``, signed and observed as
        the pool's are; the caller closes it.

        A broker sends a request to any connection that named the group it concerns: a
        transaction check to whichever of a producer group's channels is next. So the
        codes the pool serves (``serve``) are served here too, and the rest go to
        ``server_handler`` (``processor/registrations.py``)."""

        def on_request(cmd: RemotingCommand) -> ServerAnswer:
            handler = self._served.get(cmd.code)
            if handler is not None:
                return handler(name, cmd)
            return None if server_handler is None else server_handler(cmd)

        return BrokerClient(
            name, address, observer=self._observer, request_hook=self._request_hook,
            server_handler=on_request,
        )  # fmt: skip

    def broker(self, name: str) -> BrokerClient | None:
        """The client of a broker seen in some route (receipt handles name brokers)."""
        return self._brokers.get(name)

    async def broker_by_name(self, name: str, topic: str) -> BrokerClient | None:
        """The client of broker ``name``, looking up ``topic``'s route if it is not known yet
        (an ack through a proxy that has not served this topic)."""
        client = self._brokers.get(name)
        if client is None:
            try:
                await self.route(topic)
            except (TopicNotFound, RemotingError):
                return None
            client = self._brokers.get(name)
        return client

    @property
    def brokers(self) -> dict[str, BrokerClient]:
        return dict(self._brokers)

    async def ask_any_broker(self, request: RemotingCommand) -> RemotingCommand:
        """The answer of one broker of the cluster, picked at random as the Apache proxy
        picks one for its admin reads, to ``request`` (a copy, signed as the pool's are):
        a broker some route named, else one of the name server's list of the cluster.
        Raises RemotingError."""
        clients = list(self._brokers.values()) or await self._cluster_clients()
        if not clients:
            raise RemotingError("no broker of the cluster is known")
        client = random.choice(clients)
        copy = replace(request, ext_fields=dict(request.fields))
        return await client.remoting.invoke(copy, self._timeout)

    async def _cluster_clients(self) -> list[BrokerClient]:
        """Clients of the name server's list of the cluster, asked for once: callers at the
        same time (the first requests of many users) share the one look-up, so it is
        asked once and each broker gets one client."""
        if not self._listed_clients:
            await shared_lookup(self._cluster_listing, "cluster", self._list_cluster)
        return list(self._listed_clients.values())

    async def _list_cluster(self) -> None:
        answer = await self.ask_name_server(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))
        if answer.code == ResponseCode.SUCCESS and answer.body and not self._listed_clients:
            for name, address in cluster_brokers(answer.body).items():
                self._listed_clients[name] = BrokerClient(
                    name, address, observer=self._observer, request_hook=self._request_hook
                )

    async def close(self) -> None:
        for lookup in list(self._lookups.values()):
            lookup.cancel()
        for listing in list(self._cluster_listing.values()):
            listing.cancel()
        for namesrv in self._namesrvs:
            await namesrv.close()
        for client in [*self._brokers.values(), *self._retired, *self._listed_clients.values()]:
            await client.close()
