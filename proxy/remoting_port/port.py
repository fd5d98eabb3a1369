"""The remoting port: RocketMQ's own protocol for the clients that speak it (the 4.x API of
the Java client, the C++ based clients, Go's v2 client), as the Apache proxy serves it on
its ``remotingListenPort``.

A client points its name server address at the port. Route queries are answered from the
name servers with the proxy's address in place of every broker's, so everything the client
sends comes here; each request names its broker (``routing``) and goes to it on the
client's own connection to that broker (``session``), and the broker's answer comes back.

Clients whose requests never name their broker (the C++ client) need a port per broker:
with ``remoting_broker_ports`` routes name each such broker at a port of its own, and a
request that names no broker goes to the broker of the port it came in on. The client then
sees one address per broker, as without a proxy, and treats each as that broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from ssl import SSLContext
from typing import Protocol

from proxy.background import shared_lookup
from proxy.brokers import BrokerPool, TopicNotFound, cluster_brokers
from proxy.descriptors import DescriptorBudget
from proxy.message_types import accepts, message_type_of
from proxy.observability.receive_record import ReceiveRecorder
from proxy.remoting.bodies import BodyReading, reading
from proxy.remoting.client import RemotingError, RequestHook
from proxy.remoting.codes import RequestCode, ResponseCode, code_name
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.server import RemotingServer, Reply
from proxy.remoting_port.records import RECEIVES, receive_record
from proxy.remoting_port.routing import (
    Destination,
    broker_named,
    destination,
    long_poll_s,
    queue_set_empty,
    rewrite_route,
    route_brokers,
    sent_message,
)
from proxy.remoting_port.session import ClientSession
from proxy.security.guard import Denied, Guard
from proxy.security.signing import ACCESS_KEY_FIELD, SIGNATURE_FIELD

log = logging.getLogger(__name__)

# A forwarded request's deadline beyond the long poll it asks for (pull, pop, notification).
POLL_MARGIN_S = 10.0
# A forwarded request that asks for no long poll: the Apache proxy's deadline.
REQUEST_TIMEOUT_S = 3.0
# A heartbeat identical to one sent to a broker this recently is not sent again: a client
# that sees every broker at the proxy's address sends its heartbeat once per broker.
HEARTBEAT_REPEAT_S = 5.0
# The first version of the Java client that understands GO_AWAY (after V5_3_1): it opens a
# new connection and sends the request again there.
GO_AWAY_MIN_VERSION = 476
# Long polls that hold no message, answered GO_AWAY when the port starts to drain.
CUT_ON_DRAIN = frozenset(
    {RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE, RequestCode.NOTIFICATION}
)
# A draining port waits this long at most for the sends in flight before it closes.
DRAIN_S = REQUEST_TIMEOUT_S
# The name server's list of the cluster is asked for at most this often.
CLUSTER_REFRESH_S = 1.0
# request code, response code, seconds, broker, long polling
Observer = Callable[[str, str, float, str, bool], None]
# The fields of a 4.x client's ACL signature.
CREDENTIAL_FIELDS = (ACCESS_KEY_FIELD, SIGNATURE_FIELD, "SecurityToken")


# The request-code label of a request refused before it is served: the client chose its
# code, so the label is the refusal's.
REFUSED_CODES: dict[int, str] = {
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: "not_served",
    ResponseCode.NO_PERMISSION: "refused",
}


class Security(Protocol):
    """What the port needs of the proxy's security (``SecurityRuntime``): its guard, once
    started, and the proxy's own broker credentials."""

    @property
    def guard(self) -> Guard | None: ...

    @property
    def signer(self) -> RequestHook | None: ...


class RemotingPort:
    """Serves the remoting port of one proxy."""

    def __init__(
        self,
        pool: BrokerPool,
        *,
        advertise: str = "",
        broker_advertise: Mapping[str, str] | None = None,
        observe: Observer | None = None,
        security: Security | None = None,
        recorder: ReceiveRecorder | None = None,
        budget: DescriptorBudget | None = None,
    ) -> None:
        """``advertise``: the address routes name for every broker (the port's own, as
        clients reach it); when empty, the bound host and port. ``broker_advertise``: the
        same for brokers with a port of their own (by name); for one it does not name,
        the advertised host and the broker's bound port. ``observe`` sees each
        request answered: its code, the answer's code, the seconds it took, the broker it
        went to ("" for none), and whether it was a long poll. ``security``: with its
        guard on, each request must be signed by a user of the users file allowed to do
        what it asks (as on the gRPC port), and goes on signed with the proxy's own
        broker credentials, if any; with it off, a request goes on as the client signed
        it, and the broker checks it. ``budget``: the process's open-files budget, which
        each client's broker connections and each client a socket of ``listen(...,
        direct=True)`` takes take from."""
        self.pool = pool
        self._budget = budget
        self._security = security
        # Each pull and pop is a receive record (mode ``remoting``): its metrics and, with
        # an event log, its event, as a gRPC client's ReceiveMessage is.
        self._recorder = recorder
        # The client a connection's peer is (the TLS front's relays are on loopback).
        self.address_of: Callable[[str], str] = lambda peer: peer
        self.advertise = advertise
        self._observe = observe
        self._server = RemotingServer(self._process, on_closed=self._closed)
        # The broker of each listening port that serves one broker (its bound port; behind
        # the TLS front, each of its relays' ports).
        self._port_brokers: dict[int, str] = {}
        # The address routes name for each broker with a port of its own.
        self._broker_advertise: dict[str, str] = dict(broker_advertise or {})
        self._sessions: dict[RemotingConnection, ClientSession] = {}
        # Each broker's master address, from the routes answered and the cluster's list.
        self._addresses: dict[str, str] = {}
        self._cluster_asked_at = -CLUSTER_REFRESH_S
        self._cluster_lookups: dict[str, asyncio.Future[None]] = {}  # one at a time
        self._closing: set[asyncio.Task[None]] = set()
        self._sends = 0  # forwarded requests in flight that are no long poll
        self._no_sends = asyncio.Event()
        self.draining = False
        # Long polls that GO_AWAY may cut (``_poll_until_drain``), and those cut whose
        # answer is not yet written.
        self._drain_started = asyncio.Event()
        self._cuttable = 0
        self._cut = 0
        self._cuts_answered = asyncio.Event()
        self.port = 0

    async def listen(
        self,
        host: str,
        port: int,
        *,
        reuse_port: bool = False,
        ssl: SSLContext | None = None,
        broker: str | None = None,
        direct: bool = False,
    ) -> int:
        """Serve clients on ``host:port`` (TLS ones with ``ssl``); the port bound. Called
        once for the port itself, or once per kind of client behind the TLS front; and
        the same for each broker's own port, with ``broker``. ``direct``: clients reach
        this socket themselves, not through a front, so each holds a descriptor of the
        budget (a front's relay holds its own)."""
        budget = self._budget if direct else None
        bound = await self._server.start(host, port, reuse_port=reuse_port, ssl=ssl, budget=budget)
        if broker is not None:
            self._port_brokers[bound] = broker
        return bound

    def serving(self, host: str, port: int, broker_ports: Mapping[str, int] | None = None) -> None:
        """The ports clients reach: the shared one, what routes name unless ``advertise``
        was given; and each broker's own (``broker_ports``, as bound)."""
        self.port = port
        if not self.advertise:
            self.advertise = f"{host}:{port}"
        host = self.advertise.rpartition(":")[0]
        for name, bound in (broker_ports or {}).items():
            self._broker_advertise.setdefault(name, f"{host}:{bound}")

    @property
    def broker_ports(self) -> dict[str, str]:
        """The address routes name for each broker with a port of its own."""
        return dict(self._broker_advertise)

    async def close(self) -> None:
        """Drain, then close every connection. While draining, a request of a client that
        understands it is answered GO_AWAY: the client opens a new connection (through its
        balancer, to another proxy) and sends the request there. Such a client's parked
        pulls and notifications are answered GO_AWAY at once, so a consumer that sends
        nothing else hears it too. The sends in flight get ``DRAIN_S`` to end; the other
        long polls are cut: a 4.x consumer pulls again from where it was, so nothing is
        lost."""
        self.draining = True
        self._drain_started.set()
        if self._cuttable or self._cut:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cuts_answered.wait(), DRAIN_S)
        if self._sends:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._no_sends.wait(), DRAIN_S)
        await self._server.stop()
        for lookup in list(self._cluster_lookups.values()):
            lookup.cancel()
        sessions, self._sessions = self._sessions, {}
        await asyncio.gather(*(s.close() for s in sessions.values()), return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)

    @property
    def clients(self) -> int:
        return len(self._sessions)

    # -- requests -------------------------------------------------------------------------

    def _process(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        """``_answer``'s reply, observed when it is given.

        What a client names becomes a label only once the port serves the request: one
        it refuses (a code not served, a guard's refusal) is observed under the fixed
        name of its refusal, with no broker and no receive record, and a broker is named
        only once known (``_known``); /metrics stays bounded whatever clients send."""
        started = time.monotonic()
        guard = self._security.guard if self._security is not None else None
        if guard is not None and guard.needs_load(cmd.fields.get(ACCESS_KEY_FIELD)):
            return self._process_loaded(guard, cmd, conn, started)
        return self._process_checked(cmd, conn, started)

    async def _process_loaded(
        self, guard: Guard, cmd: RemotingCommand, conn: RemotingConnection, started: float
    ) -> RemotingCommand | None:
        """``_process`` once the user the request names is read from the cluster."""
        try:
            await guard.load(code_name(cmd.code, RequestCode), cmd.fields.get(ACCESS_KEY_FIELD))
        except Denied as denied:
            refusal = cmd.make_response(ResponseCode.NO_PERMISSION, remark=denied.message)
            return self._refused(refusal, started)
        reply = self._process_checked(cmd, conn, started)
        return reply if reply is None or isinstance(reply, RemotingCommand) else await reply

    def _refused(self, refusal: RemotingCommand, started: float) -> RemotingCommand:
        if self._observe is not None:
            self._observe(
                REFUSED_CODES.get(refusal.code, "refused"),
                code_name(refusal.code, ResponseCode),
                time.monotonic() - started,
                "",
                False,
            )
        return refusal

    def _process_checked(
        self, cmd: RemotingCommand, conn: RemotingConnection, started: float
    ) -> Reply:
        body = reading(cmd)  # once: the guard checks, and the relay routes by, the same
        refusal = self._refusal(cmd, conn, body)
        if refusal is not None:
            return self._refused(refusal, started)
        broker = self._broker_of(cmd, conn, body)
        reply = self._answer(cmd, conn, broker, body)
        if self._observe is None and self._recorder is None:
            return reply
        if reply is None or isinstance(reply, RemotingCommand):
            self._observed(cmd, reply, broker or "", started)
            return reply
        return self._observed_later(cmd, reply, broker or "", started)

    async def _observed_later(
        self,
        cmd: RemotingCommand,
        reply: Awaitable[RemotingCommand | None],
        broker: str,
        started: float,
    ) -> RemotingCommand | None:
        answer = await reply
        self._observed(cmd, answer, broker, started)
        return answer

    def _observed(
        self, cmd: RemotingCommand, answer: RemotingCommand | None, broker: str, started: float
    ) -> None:
        wait_s = time.monotonic() - started
        broker = broker if self._known(broker) else ""
        poll_s = long_poll_s(cmd)
        if self._observe is not None:
            self._observe(
                code_name(cmd.code, RequestCode),
                "oneway" if answer is None else code_name(answer.code, ResponseCode),
                wait_s,
                broker,
                poll_s is not None,
            )
        if self._recorder is not None and cmd.code in RECEIVES and answer is not None:
            self._recorder.record_receive(receive_record(cmd, answer, broker, wait_s), wait_s)

    def _broker_of(
        self, cmd: RemotingCommand, conn: RemotingConnection, body: BodyReading
    ) -> str | None:
        """The broker a request goes to: the one it names, else the one of the port it
        came in on (for a heartbeat, its only broker there); None for neither, or for a
        request no broker answers."""
        where = destination(cmd)
        own = self._port_brokers.get(conn.local_port)
        if where in (Destination.NAMED_BROKER, Destination.ANY_BROKER):
            return broker_named(cmd, body) or own
        return own if where is Destination.EVERY_BROKER else None

    def _refusal(
        self, cmd: RemotingCommand, conn: RemotingConnection, body: BodyReading
    ) -> RemotingCommand | None:
        """The answer to a request the port does not take: a code it does not serve, or
        one the guard refuses; None for the rest (the client's credentials removed: the
        broker gets the proxy's)."""
        if destination(cmd) is Destination.NOT_SERVED:
            return cmd.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f" request type {cmd.code} not supported",
            )
        guard = self._security.guard if self._security is not None else None
        if guard is not None:
            try:
                guard.check_remoting(cmd, body, self.address_of(conn.peer))
            except Denied as denied:
                return cmd.make_response(ResponseCode.NO_PERMISSION, remark=denied.message)
            for name in CREDENTIAL_FIELDS:
                cmd.fields.pop(name, None)
        return None

    def _known(self, broker: str) -> bool:
        """A broker of the cluster (a route or the cluster's list named it), not merely a
        name a client wrote."""
        return bool(broker) and self._address(broker) is not None

    def _answer(
        self,
        cmd: RemotingCommand,
        conn: RemotingConnection,
        broker: str | None,
        body: BodyReading,
    ) -> Reply:
        where = destination(cmd)
        if self.draining and cmd.version >= GO_AWAY_MIN_VERSION:
            return cmd.make_response(ResponseCode.GO_AWAY, remark="please go away")
        if where is Destination.NAME_SERVER:
            return self._route(cmd)
        session = self._session(conn)
        if where is Destination.EVERY_BROKER and broker is None:
            return self._every_broker(session, cmd)
        if queue_set_empty(body):
            return cmd.make_response(ResponseCode.SUCCESS, body=b'{"lockOKMQSet":[]}')
        return self._forward(session, cmd, where, broker)

    def _session(self, conn: RemotingConnection) -> ClientSession:
        session = self._sessions.get(conn)
        if session is None:
            security = self._security
            signer = security.signer if security is not None and security.guard else None
            session = ClientSession(
                conn, self._server.request, self._server.send_oneway,
                request_hook=signer, budget=self._budget,
            )  # fmt: skip
            self._sessions[conn] = session
        return session

    async def _forward(
        self, session: ClientSession, cmd: RemotingCommand, where: Destination, broker: str | None
    ) -> RemotingCommand | None:
        if broker is None and where is Destination.ANY_BROKER:
            known = await self._brokers()
            broker = next(iter(session.brokers or sorted(known)), None)
        if broker is None:
            return cmd.make_response(
                ResponseCode.VERSION_NOT_SUPPORTED, remark="Request doesn't have field bname"
            )
        address = self._address(broker)
        if address is None:
            await self._brokers(refresh=True)
            address = self._address(broker)
        if address is None:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR, remark=f"broker {broker} is not known to the proxy"
            )
        refusal = await self._type_refusal(cmd)
        if refusal is not None:
            return refusal
        poll = long_poll_s(cmd)
        if poll is not None:
            if cmd.code in CUT_ON_DRAIN and cmd.version >= GO_AWAY_MIN_VERSION:
                return await self._poll_until_drain(session, broker, address, cmd, poll)
            return await session.forward(broker, address, cmd, poll + POLL_MARGIN_S)
        self._sends += 1
        self._no_sends.clear()
        try:
            return await session.forward(broker, address, cmd, REQUEST_TIMEOUT_S)
        finally:
            self._sends -= 1
            if not self._sends:
                self._no_sends.set()

    async def _poll_until_drain(
        self,
        session: ClientSession,
        broker: str,
        address: str,
        cmd: RemotingCommand,
        poll_s: float,
    ) -> RemotingCommand | None:
        """A long poll that holds no message (a pull, a notification), cut with GO_AWAY
        when the port starts draining: a consumer that only polls is told to move too,
        not left parked until the port closes under it. Its next pull starts from the
        same offset elsewhere, so nothing is lost."""
        forward = asyncio.ensure_future(
            session.forward(broker, address, cmd, poll_s + POLL_MARGIN_S)
        )
        drain = asyncio.ensure_future(self._drain_started.wait())
        self._cuttable += 1
        try:
            await asyncio.wait((forward, drain), return_when=asyncio.FIRST_COMPLETED)
            cut = not forward.done()
            if cut:
                self._cut += 1  # counted down once the server has written the answer
        finally:
            drain.cancel()
            self._cuttable -= 1
            self._check_cuts()
        if not cut:
            return forward.result()
        forward.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await forward
        task = asyncio.current_task()
        if task is not None:  # the server's callback, which writes the answer, comes first
            task.add_done_callback(self._cut_answered)
        else:
            self._cut_answered(None)
        return cmd.make_response(ResponseCode.GO_AWAY, remark="please go away")

    def _cut_answered(self, _task: object) -> None:
        self._cut -= 1
        self._check_cuts()

    def _check_cuts(self) -> None:
        if not self._cut and not self._cuttable:
            self._cuts_answered.set()

    async def _type_refusal(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """A send its topic's ``message.type`` does not take, refused as the Apache proxy
        refuses it on either port (the broker stores any type); None for the rest."""
        sent = sent_message(cmd)
        if sent is None or sent.topic.startswith("%"):  # a retry or system topic: untyped
            return None
        try:
            route = await self.pool.route(sent.topic)
        except (TopicNotFound, RemotingError):
            return None  # the broker answers for a topic the proxy cannot see
        message_type = message_type_of(sent.properties)
        if accepts(route.message_type, message_type):
            return None
        expected = route.message_type.value or "NORMAL"
        return cmd.make_response(
            ResponseCode.MESSAGE_ILLEGAL,
            remark=f"TopicMessageType validate failed, the expected type is {expected}, "
            f"but actual type is {message_type.value}",
        )

    def _address(self, broker: str) -> str | None:
        client = self.pool.broker(broker)
        return self._addresses.get(broker) or (client.address if client else None)

    async def _brokers(self, refresh: bool = False) -> dict[str, str]:
        """Every broker known, by name: learned from the routes answered, or else (and on
        ``refresh``) from the name server's list of the cluster, asked at most once every
        ``CLUSTER_REFRESH_S``: a client naming a broker nobody knows costs the name
        server nothing more. Requests that arrive while the list is being asked for wait
        for it: the pulls a consumer sends at once to a proxy that has just started (after
        a drain moved it there) all find their brokers."""
        if self._addresses and not refresh:
            return self._addresses
        asking = self._cluster_lookups.get("cluster")
        if asking is not None:
            await asyncio.shield(asking)
            return self._addresses
        now = time.monotonic()
        if now < self._cluster_asked_at + CLUSTER_REFRESH_S:
            return self._addresses
        self._cluster_asked_at = now
        await shared_lookup(self._cluster_lookups, "cluster", self._ask_cluster)
        return self._addresses

    async def _ask_cluster(self) -> None:
        request = RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO)
        try:
            answer = await self.pool.ask_name_server(request)
        except RemotingError as exc:
            log.warning("remoting port: the cluster's brokers are not known: %s", exc)
            return
        if answer.code == ResponseCode.SUCCESS and answer.body:
            self._addresses.update(cluster_brokers(answer.body))

    async def _route(self, cmd: RemotingCommand) -> RemotingCommand:
        try:
            answer = await self.pool.ask_name_server(cmd)
        except RemotingError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark=f"name server: {exc}")
        if answer.code != ResponseCode.SUCCESS or not answer.body:
            return answer
        self._addresses.update(route_brokers(answer.body))
        answer.body = rewrite_route(
            answer.body, lambda broker: self._broker_advertise.get(broker, self.advertise)
        )
        return answer

    async def _every_broker(self, session: ClientSession, cmd: RemotingCommand) -> RemotingCommand:
        """A heartbeat or an unregistration: to every broker, each on the client's own
        connection, so each lists the client as it would without the proxy. The client
        gets the first success (a failure only if every broker failed)."""
        brokers = await self._brokers()
        now = time.monotonic()
        todo = []
        for broker, address in sorted(brokers.items()):
            body, sent_at = session.heartbeats.get(broker, (b"", -HEARTBEAT_REPEAT_S))
            repeated = (
                cmd.code == RequestCode.HEART_BEAT
                and body == cmd.body
                and now - sent_at < HEARTBEAT_REPEAT_S
            )
            if not repeated:
                todo.append((broker, address))
        if not todo:
            return cmd.make_response(ResponseCode.SUCCESS)
        answers = await asyncio.gather(
            *(session.forward(b, a, cmd, REQUEST_TIMEOUT_S) for b, a in todo)
        )
        for (broker, _), answer in zip(todo, answers, strict=True):
            if cmd.code == RequestCode.HEART_BEAT and answer and answer.code == 0:
                session.heartbeats[broker] = (cmd.body, now)
        given = [a for a in answers if a is not None]
        good = [a for a in given if a.code == ResponseCode.SUCCESS]
        return (good or given or [cmd.make_response(ResponseCode.SUCCESS)])[0]

    def _closed(self, conn: RemotingConnection) -> None:
        session = self._sessions.pop(conn, None)
        if session is None:
            return
        task = asyncio.get_running_loop().create_task(session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
