"""A client's session: Heartbeat, the Settings exchange on Telemetry, termination, and the
commands the proxy writes on a Telemetry stream (a producer's transaction checks, a lite
consumer's lost lite topics, a consumer's request for its thread stacks).

A Telemetry stream is authenticated at its start (``MessagingService``), and each Settings
it writes, the first and every later one, is authorized for the stream's user before
anything of it is done (``ClientOf.authorize``, the guard's ``Guard.authorize``): a
consumer's group must be allowed to subscribe to each of its topics, a producer must be
allowed to publish to each of its. A refused Settings is answered FORBIDDEN, counted, and
changes nothing; the stream goes on. With no users file every Settings is allowed.

What the allowed Settings make the proxy keep: the client's registration with the brokers
(``processor/registrations.py``, within its bounds; a later Settings replaces it), a
producer's topics, which it names to the brokers so that their transaction checks reach it
(``processor/transaction.py``), and a lite consumer's group, to which it passes the brokers'
word that a lite topic was taken from it (``processor/lite.py``). A consumer's settings say
whether its group is FIFO (``subscription.fifo``, from the group's config on the brokers)
and carry a lite group's quota. Heartbeats and termination tell the handle renewer whether
a push consumer is still there; a lite consumer's termination drops its lite subscriptions
on the brokers. What one stream carries (its outbox, its pace, its end in a drain) is
``proxy.api.outbox``; how many streams there may be, ``STREAMS_PER_CLIENT`` and
``max_telemetry_streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ApiError, Code, ok
from proxy.api.outbox import (
    COMMAND_BURST,
    COMMANDS_PER_S,
    OUTBOX_LIMIT,
    CommandPace,
    DrainEnd,
    Outbox,
    end_for_drain,
    end_with,
    lite_unsubscribe_sink,
    transaction_check_sink,
)
from proxy.api.settings import answer_settings
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.config import ProxyConfig
from proxy.groups import GroupConfig, GroupSettings
from proxy.processor.lite import LiteProcessor
from proxy.processor.registrations import Registered, Registrations, registered
from proxy.processor.renewal import HandleRenewer
from proxy.processor.transaction import TransactionProcessor

# Telemetry streams one client id may hold open on this proxy. An official client holds
# one per proxy (two for a moment when it reopens it). Past the cap a stream is answered
# TOO_MANY_REQUESTS and ended, so a client that leaks streams, or opens them on purpose,
# costs bounded memory (and all clients together at most ``max_telemetry_streams``); a
# stream that writes commands faster than ``COMMANDS_PER_S`` is ended too.
STREAMS_PER_CLIENT = 8


# What a Telemetry stream's user may set: raises the ApiError (FORBIDDEN) of Settings the
# user may not make (``MessagingService`` builds it from the guard and the user the
# stream's start authenticated); None: no users file, every Settings is allowed.
SettingsGuard = Callable[[pb.Settings], None]


@dataclass(frozen=True, slots=True)
class ClientOf:
    """Who holds a Telemetry stream: its id, the language and version it names, and what
    its user may set."""

    client_id: str
    language: str
    version: str
    authorize: SettingsGuard | None = None


@dataclass(frozen=True, slots=True)
class _Answered:
    """A client command's answer (None: nothing to answer) and, for Settings that were
    allowed and answered OK, what they name: a producer's topics, who the client is for
    the registrations, the settings themselves."""

    command: api.TelemetryCommand | None
    topics: list[str] = field(default_factory=list)
    known: Registered | None = None
    settings: pb.Settings | None = None


class SessionActivity:
    def __init__(
        self,
        config: ProxyConfig,
        groups: GroupSettings,
        renewer: HandleRenewer,
        transactions: TransactionProcessor | None = None,
        lite: LiteProcessor | None = None,
        registrations: Registrations | None = None,
    ) -> None:
        self.config = config
        self.groups = groups
        self.renewer = renewer
        self.transactions = transactions
        self.lite = lite
        self.registrations = registrations
        # The task serving each open Telemetry stream, and how a drain ends it
        # (``DrainEnd``): ``drain`` ends them all.
        self._streams: dict[asyncio.Task[object], DrainEnd] = {}
        # Open streams per client id, and the limits (STREAMS_PER_CLIENT, the pace of
        # each stream's commands) with what they did.
        self._per_client: dict[str, int] = {}
        self.streams_per_client = STREAMS_PER_CLIENT
        self.command_burst = COMMAND_BURST
        self.commands_per_s = COMMANDS_PER_S
        self.streams_refused = 0
        self.streams_too_fast = 0
        self.settings_refused = 0  # Settings the stream's user may not make (FORBIDDEN)
        self.draining = False
        # The outbox of each registered consumer's stream, by client id, and the replies
        # awaited from clients by nonce (``ask``: a broker's question relayed to a client).
        self._askable: dict[str, Outbox] = {}
        self._asked: dict[str, asyncio.Future[api.TelemetryCommand]] = {}

    def status(self) -> dict[str, int]:
        """The open Telemetry streams, the clients holding them, and how often the limits
        acted: streams refused (a client past STREAMS_PER_CLIENT, or the proxy at
        ``max_telemetry_streams``), streams ended past their pace (COMMANDS_PER_S)."""
        return {
            "streams": len(self._streams),
            "clients": len(self._per_client),
            "streams_refused": self.streams_refused,
            "streams_too_fast": self.streams_too_fast,
            "settings_refused": self.settings_refused,
        }

    def drain(self) -> int:
        """End every open Telemetry stream (the proxy stops; its gRPC server has already
        told each connection to go away): each gets a ReconnectEndpointsCommand, then its
        end. A client opens its stream again on a new connection, i.e. at another proxy of
        its fleet. The number of streams ended."""
        self.draining = True
        for task in self._streams:
            task.cancel()
        return len(self._streams)

    async def ask(
        self, client_id: str, command: api.TelemetryCommand, nonce: str, timeout_s: float
    ) -> api.TelemetryCommand | None:
        """Write ``command`` (which carries ``nonce``) to the stream of ``client_id``, a
        consumer registered here, and return the client's reply with the same nonce; None
        when it has no such stream here, its outbox is full, or it does not reply in time."""
        outbox = self._askable.get(client_id)
        if outbox is None:
            return None
        reply: asyncio.Future[api.TelemetryCommand] = asyncio.get_running_loop().create_future()
        self._asked[nonce] = reply
        try:
            outbox.put_nowait(command)
            return await asyncio.wait_for(reply, timeout_s)
        except (asyncio.QueueFull, TimeoutError):
            return None
        finally:
            self._asked.pop(nonce, None)

    def holds_stream(self, client_id: str) -> bool:
        """Whether ``client_id`` has a Telemetry stream open here: it is alive."""
        return client_id in self._per_client

    async def heartbeat(
        self, request: api.HeartbeatRequest, context: Context
    ) -> api.HeartbeatResponse:
        self.renewer.seen(check.require_client_id(context))
        return api.HeartbeatResponse(status=ok())

    async def notify_client_termination(
        self, request: api.NotifyClientTerminationRequest, context: Context
    ) -> api.NotifyClientTerminationResponse:
        client_id = check.require_client_id(context)
        self.renewer.client_gone(client_id)
        if self.registrations is not None:
            self.registrations.remove(client_id)
        if self.lite is not None and request.group.name:
            # A lite consumer's subscriptions live on the brokers under its client id; left
            # there, the brokers keep giving its lite topics' events to it for minutes
            # (a shared group gives each event to one client), so drop them now, as the
            # Apache proxy does. Its parent topic is its group's lite.bind.topic.
            group = await self.groups.config(request.group.name, None)
            if group.lite_bind_topic:
                await self.lite.drop_client(client_id, request.group.name, group.lite_bind_topic)
        return api.NotifyClientTerminationResponse(status=ok())

    async def _group_config(self, settings: pb.Settings) -> GroupConfig:
        """A consumer's group config (asked of a broker of its first topic): FIFO, lite."""
        if settings.WhichOneof("pub_sub") != "subscription":
            return GroupConfig()
        sub = settings.subscription
        if not sub.group.name or not sub.subscriptions:
            return GroupConfig()
        return await self.groups.config(sub.group.name, sub.subscriptions[0].topic.name)

    async def telemetry(
        self,
        commands: AsyncIterator[api.TelemetryCommand],
        context: Context,
        authorize: SettingsGuard | None = None,
    ) -> AsyncIterator[api.TelemetryCommand]:
        """Answer each Settings the client writes: FORBIDDEN if its user may not make it
        (``authorize``; None: every Settings is allowed), else the completed settings,
        status OK, and the client registered as they say (``_answer``).

        A stream that carries only those answers is served here, in turn with the
        client's commands: no task and no queue for it. That is a consumer's with
        registrations off. A stream the proxy also writes to while the client is silent
        (a producer's transaction checks, a lite consumer's lost lite topics, a
        registered consumer's request for its thread stacks) gets, from its first
        allowed settings on, a reader task and a bounded outbox (``_stream``): its later
        commands, later Settings among them, are answered by the reader as the first
        were."""
        try:
            client_id = check.require_client_id(context)
        except ApiError as err:
            yield api.TelemetryCommand(status=err.status)
            return
        task = asyncio.current_task()
        if task is None or self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the proxy is draining")
            return
        held = self._per_client.get(client_id, 0)
        refused = self._refusal(client_id, held)
        if refused is not None:
            self.streams_refused += 1
            yield api.TelemetryCommand(status=refused.status)
            return
        language = check.metadata_value(context, "x-mq-language")
        self._streams[task] = DrainEnd.of(language)
        self._per_client[client_id] = held + 1
        version = check.metadata_value(context, "x-mq-client-version")
        client = ClientOf(client_id, language or "", version or "", authorize)
        try:
            async for out in self._serve(commands, client):
                yield out
        except asyncio.CancelledError:
            if not self.draining:
                raise  # the client went away, or the server stops the call
            task.uncancel()  # our own cancel (drain), delivered: the stream ends cleanly
            end = self._streams.get(task, DrainEnd.COMMAND)
            if end is not DrainEnd.QUIET:
                yield api.TelemetryCommand(
                    reconnect_endpoints_command=api.ReconnectEndpointsCommand(nonce=client_id)
                )
            if end is DrainEnd.UNAVAILABLE:
                await end_for_drain(context)
        finally:
            self._streams.pop(task, None)
            left = self._per_client.pop(client_id, 1) - 1
            if left:
                self._per_client[client_id] = left
            elif self.registrations is not None:
                self.registrations.remove(client_id)  # its last stream here ended

    def _refusal(self, client_id: str, held: int) -> ApiError | None:
        """Why a new stream of ``client_id`` (which holds ``held``) is refused, if it is:
        the client holds its most (STREAMS_PER_CLIENT), or the proxy does
        (``max_telemetry_streams``)."""
        if held >= self.streams_per_client:
            return ApiError(
                Code.TOO_MANY_REQUESTS,
                f"client {client_id} already holds {held} telemetry streams on this proxy",
            )
        if len(self._streams) >= self.config.max_telemetry_streams:
            return ApiError(
                Code.TOO_MANY_REQUESTS,
                f"this proxy holds {len(self._streams)} telemetry streams, its most",
            )
        return None

    def _too_fast(self, pace: CommandPace) -> api.TelemetryCommand | None:
        """Before a stream's next command is served: None if it is within its pace
        (``CommandPace``), else the answer that ends the stream."""
        if pace.take():
            return None
        self.streams_too_fast += 1
        refused = ApiError(
            Code.TOO_MANY_REQUESTS,
            f"more than {pace.burst} telemetry commands at once or {pace.per_s:g} a second",
        )
        return api.TelemetryCommand(status=refused.status)

    async def _serve(
        self, commands: AsyncIterator[api.TelemetryCommand], client: ClientOf
    ) -> AsyncIterator[api.TelemetryCommand]:
        client_id = client.client_id
        pace = CommandPace(self.command_burst, self.commands_per_s)
        async for command in commands:
            if (refused := self._too_fast(pace)) is not None:
                yield refused
                return
            answered = await self._answer(command, client)
            answer = answered.command
            if answer is None:
                continue
            if answered.topics and self.transactions is not None:
                register = functools.partial(self._register_producer, answered.topics)
                async for out in self._stream(commands, answer, register, pace, client):
                    yield out
                return
            lite_group = _lite_group(answered)
            if lite_group is not None and self.lite is not None:
                register = functools.partial(self._register_lite, lite_group, client_id)
                async for out in self._stream(commands, answer, register, pace, client):
                    yield out
                return
            known = answered.known
            if self.registrations is not None and known is not None and known.consumer_group:
                # A consumer with registrations on: the brokers may ask it things (its
                # thread stacks) through this proxy, so its stream carries the proxy's
                # commands too.
                register = functools.partial(self._register_askable, client_id)
                async for out in self._stream(commands, answer, register, pace, client):
                    yield out
                return
            yield answer

    async def _answer(self, command: api.TelemetryCommand, client: ClientOf) -> _Answered:
        """The answer to a client's command (None: nothing to answer, e.g. the result of a
        check we sent). A Settings is authorized first (``client.authorize``), before
        anything of it reaches a broker: refused, it is answered FORBIDDEN (as the Apache
        proxy answers a command its authorization refuses) and changes nothing. Allowed,
        the client is registered with the brokers as these settings say (again, for its
        later ones: they replace the earlier), within the registrations' bounds."""
        kind = command.WhichOneof("command")
        if kind in ("thread_stack_trace", "verify_message_result"):
            reply = self._asked.get(getattr(command, kind).nonce)
            if reply is not None and not reply.done():
                reply.set_result(command)  # the answer to a question we relayed
            return _Answered(None)
        if kind != "settings":
            return _Answered(None)
        try:
            if client.authorize is not None:
                client.authorize(command.settings)
        except ApiError as err:
            self.settings_refused += 1
            return _Answered(api.TelemetryCommand(status=err.status))
        group = await self._group_config(command.settings)
        try:
            settings = answer_settings(
                command.settings,
                max_body_bytes=self.config.max_body_bytes,
                max_polling_ms=self.config.receive.max_polling_ms,
                retry=group.retry,
                fifo=group.fifo,
                lite_quota=group.lite_quota,
                max_lite_topic_size=self.config.max_lite_topic_size,
                client_metrics=self.config.client_metrics,
            )
        except ApiError as err:
            return _Answered(api.TelemetryCommand(status=err.status))
        known = registered(client.client_id, client.language, client.version, command.settings)
        if known is not None and self.registrations is not None:
            await self.registrations.add(known)  # or not, past a bound: it is served anyway
        return _Answered(
            api.TelemetryCommand(status=ok(), settings=settings),
            [t.name for t in command.settings.publishing.topics],
            known,
            command.settings,
        )

    def _register_producer(
        self, topics: list[str], outbox: asyncio.Queue[api.TelemetryCommand | None]
    ) -> Callable[[], None]:
        assert self.transactions is not None
        return self.transactions.register(topics, transaction_check_sink(outbox))

    def _register_askable(self, client_id: str, outbox: Outbox) -> Callable[[], None]:
        self._askable[client_id] = outbox

        def forget() -> None:
            if self._askable.get(client_id) is outbox:
                del self._askable[client_id]

        return forget

    def _register_lite(
        self, group: str, client_id: str, outbox: asyncio.Queue[api.TelemetryCommand | None]
    ) -> Callable[[], None]:
        assert self.lite is not None
        return self.lite.register(group, client_id, lite_unsubscribe_sink(outbox))

    async def _stream(
        self,
        commands: AsyncIterator[api.TelemetryCommand],
        first: api.TelemetryCommand,
        register: Callable[[asyncio.Queue[api.TelemetryCommand | None]], Callable[[], None]],
        pace: CommandPace,
        client: ClientOf,
    ) -> AsyncIterator[api.TelemetryCommand]:
        """The rest of a stream that also carries the server's commands (a producer's
        transaction checks, a lite consumer's lost lite topics): the answer ``first``, then
        what ``register`` puts in the outbox and answers to further commands, in order."""
        outbox: asyncio.Queue[api.TelemetryCommand | None] = asyncio.Queue(OUTBOX_LIMIT)
        outbox.put_nowait(first)
        forget = register(outbox)
        reader = asyncio.get_running_loop().create_task(self._read(commands, outbox, pace, client))
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader  # the client's stream may have failed; nothing to tell it
            forget()

    async def _read(
        self,
        commands: AsyncIterator[api.TelemetryCommand],
        outbox: asyncio.Queue[api.TelemetryCommand | None],
        pace: CommandPace,
        client: ClientOf,
    ) -> None:
        """The client's commands after its first settings: each answered as the first was
        (``_answer``: a later Settings authorized, then registered in place of the earlier
        ones, so a consumer's new subscription reaches the brokers and its group's lag)."""
        try:
            async for command in commands:
                if (refused := self._too_fast(pace)) is not None:
                    end_with(outbox, refused)
                    return
                answer = (await self._answer(command, client)).command
                if answer is not None:
                    await outbox.put(answer)
        finally:
            # The client closed its side (or the stream failed): end ours. A full outbox
            # means the writer is gone too; it is cancelled with the stream.
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait(None)


_LITE_CONSUMERS = (pb.ClientType.LITE_PUSH_CONSUMER, pb.ClientType.LITE_SIMPLE_CONSUMER)


def _lite_group(answered: _Answered) -> str | None:
    """The group of a lite consumer's settings that were allowed, else None."""
    settings = answered.settings
    if settings is None or settings.client_type not in _LITE_CONSUMERS:
        return None
    return settings.subscription.group.name or None
