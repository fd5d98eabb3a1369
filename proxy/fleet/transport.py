"""The links between the proxies of a fleet: one gRPC stream from each proxy to each other.

Every proxy serves the method ``/rmqproxy.fleet.Peers/Link`` on its fleet port. To talk to
a peer it holds one call to it, a client stream, and writes frames on it; the peer reads
them and hands each message to its shared hub as coming from the caller (named in the
call's ``x-fleet-member`` metadata). Answers go back on the answering proxy's own call, so
each direction is one stream and a broken one is noticed by its writer.

A frame is a JSON list of messages (``messages.PeerMessage`` as a list of its fields): a
few dozen bytes each, no generated code, readable in a packet capture.

Failure: every stream carries at least one frame every ``HEARTBEAT_S`` (an empty one when
there is nothing to say), and a peer is heard when its frames arrive on its own stream to
this proxy. A peer not heard for ``SILENCE_S`` is lost: dead, frozen, or cut off in either
direction, whatever TCP believes (gRPC's keepalive pings did not notice a frozen peer in
15 s here). The hub is told ``peer_lost`` (its keys fall back to local probes), and
``send`` to that peer refuses until it is heard again. A write that does not finish within
``SILENCE_S`` resets the stream, which dials again every ``RECONNECT_S``. A full outbox
(``OUTBOX``) refuses too: the hub falls back rather than wait.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import grpc

from proxy.background import start_background, stop_background
from proxy.fleet.members import Members
from proxy.fleet.messages import SETTLE_KINDS, Outcome, PeerKind, PeerMessage

log = logging.getLogger(__name__)

METHOD = "/rmqproxy.fleet.Peers/Link"
MEMBER_HEADER = "x-fleet-member"
KEEPALIVE_S = 1.0
HEARTBEAT_S = 0.5
SILENCE_S = 2.0
RECONNECT_S = 1.0
CONNECT_TIMEOUT_S = 2.0
OUTBOX = 10_000  # messages queued for one peer at most
FRAME = 256  # messages per frame at most


class PeerHandler(Protocol):
    """What the links tell: ``SharedProbeHub`` (``proxy/receive/shared.py``) and
    ``FleetSettles`` (``settle.py``), through ``PeerHandlers``."""

    def receive(self, peer: str, message: PeerMessage) -> None: ...

    def peer_lost(self, peer: str) -> None: ...

    def members_changed(self) -> None: ...


class PeerHandlers:
    """Each message to the part it is about: a settle's to ``settles``, the rest to
    ``probes``; a lost peer and a change of members to both."""

    def __init__(self, probes: PeerHandler | None, settles: PeerHandler | None) -> None:
        self.parts = [p for p in (probes, settles) if p is not None]
        self.probes = probes
        self.settles = settles

    def receive(self, peer: str, message: PeerMessage) -> None:
        part = self.settles if message.kind in SETTLE_KINDS else self.probes
        if part is not None:
            part.receive(peer, message)

    def peer_lost(self, peer: str) -> None:
        for part in self.parts:
            part.peer_lost(peer)

    def members_changed(self) -> None:
        for part in self.parts:
            part.members_changed()


def _row(m: PeerMessage) -> list[object]:
    row: list[object] = [
        m.kind.value, m.group, m.topic, list(m.brokers), round(m.remaining_s, 3),
        int(m.order), int(m.missed),
    ]  # fmt: skip
    if m.kind in SETTLE_KINDS:
        # Only the settle kinds carry these, so that a proxy of an earlier version, which
        # knows seven fields, still reads the probe messages of a newer one.
        row += [m.ref, m.handle, m.outcome.value]
    return row


def encode(messages: Sequence[PeerMessage]) -> bytes:
    return json.dumps([_row(m) for m in messages], separators=(",", ":")).encode()


def decode(frame: bytes) -> list[PeerMessage]:
    """The messages of a frame; ValueError for anything else."""
    try:
        out = []
        for row in json.loads(frame):
            kind, group, topic, brokers, remaining, order, missed, *settle = row
            ref, handle, outcome = settle if settle else (0, "", "")
            out.append(
                PeerMessage(PeerKind(kind), str(group), str(topic),
                            tuple(str(b) for b in brokers), float(remaining), bool(order),
                            bool(missed), int(ref), str(handle), Outcome(outcome))
            )  # fmt: skip
        return out
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"not a fleet frame: {exc}") from exc


def _identity(data: bytes) -> bytes:
    return data


class _Outbound:
    """The stream to one peer, its outbox, and the task that dials and writes."""

    def __init__(self, links: FleetLinks, peer: str) -> None:
        self.links = links
        self.peer = peer
        self.outbox: deque[PeerMessage] = deque()
        self.writing = 0  # messages of the frame being written
        self.ready = asyncio.Event()
        self.up = False
        self.task = start_background(self._run(), name=f"fleet link {peer}", log=log)

    def send(self, message: PeerMessage) -> bool:
        if not self.up or len(self.outbox) >= OUTBOX or not self.links.heard(self.peer):
            return False
        self.outbox.append(message)
        self.ready.set()
        return True

    async def _run(self) -> None:
        options = [
            ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_S * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.use_local_subchannel_pool", 1),  # a connection of its own
        ]
        while True:
            channel = grpc.aio.insecure_channel(self.peer, options=options)
            try:
                await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
                link = channel.stream_unary(
                    METHOD, request_serializer=_identity, response_deserializer=_identity
                )
                # No request iterator: the frames are written on the call (``_pump``).
                call = link(None, metadata=((MEMBER_HEADER, self.links.self_id),))
                self.up = True
                log.info("fleet link to %s up", self.peer)
                await self._pump(call)
            # A write on a call that has just ended raises InvalidStateError ("RPC already
            # finished"), not the call's error: the link is lost all the same.
            except (
                grpc.aio.AioRpcError,
                TimeoutError,
                ConnectionError,
                asyncio.InvalidStateError,
            ) as exc:
                if self.up:
                    log.warning("fleet link to %s lost: %r", self.peer, exc)
            finally:
                was_up, self.up = self.up, False
                self.outbox.clear()
                self.writing = 0
                await channel.close(None)
                if was_up:
                    self.links.lost(self.peer)
            await asyncio.sleep(RECONNECT_S)

    async def _pump(self, call: grpc.aio.StreamUnaryCall[bytes, bytes]) -> None:
        """Write the outbox in frames until the call fails (the peer gone: its keepalive
        unanswered, its connection closed) or the peer ends it."""
        ended = asyncio.ensure_future(_until_end(call))
        try:
            while True:
                if not self.outbox:
                    self.ready.clear()
                    more = asyncio.ensure_future(self.ready.wait())
                    try:
                        await asyncio.wait(
                            {ended, more}, timeout=HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        more.cancel()
                    if ended.done():
                        ended.result()  # the call's error, if it failed
                        raise ConnectionError("the peer ended the link")
                frame = [self.outbox.popleft() for _ in range(min(FRAME, len(self.outbox)))]
                self.writing = len(frame)
                await asyncio.wait_for(call.write(encode(frame)), SILENCE_S)  # [] = heartbeat
                self.writing = 0
        finally:
            ended.cancel()


async def _until_end(call: grpc.aio.StreamUnaryCall[bytes, bytes]) -> None:
    await call


class FleetLinks:
    """``PeerLinks`` (``links.py``) over gRPC: the fleet port's server, one ``_Outbound``
    per other member, and the membership they follow."""

    def __init__(self, members: Members, listen: str, advertise: str | None = None) -> None:
        """``listen``: host:port of the fleet port (port 0: a free one); ``advertise``: the
        address the other members list this one at (default the listen address)."""
        self._self_id = advertise or listen
        self.advertise = advertise
        self.source = members
        self.listen = listen
        self.handler: PeerHandler | None = None
        self._members: list[str] = [self._self_id]
        self._outbound: dict[str, _Outbound] = {}
        self._server: grpc.aio.Server | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._heard: dict[str, float] = {}  # peer -> loop time its last frame arrived
        self._silent: set[str] = set()  # peers told lost for silence, until heard again
        self.port = 0
        self.received = 0
        self.refused = 0  # frames that were not fleet frames

    @property
    def self_id(self) -> str:
        return self._self_id

    def members(self) -> Sequence[str]:
        return self._members

    def send(self, peer: str, message: PeerMessage) -> bool:
        outbound = self._outbound.get(peer)
        return outbound is not None and outbound.send(message)

    async def flush(self, peer: str, timeout_s: float) -> bool:
        """Wait until what was sent to ``peer`` has been written to its stream (a proxy
        about to close its links); False if the link went down or ``timeout_s`` passed."""
        outbound = self._outbound.get(peer)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while outbound is not None and outbound.up and (outbound.outbox or outbound.writing):
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return outbound is not None and outbound.up

    def lost(self, peer: str) -> None:
        if self.handler is not None:
            self.handler.peer_lost(peer)

    def heard(self, peer: str) -> bool:
        """Whether ``peer``'s frames arrived lately: its stream to this proxy is alive."""
        return peer not in self._silent and peer in self._heard

    async def _watch_silence(self) -> None:
        """A peer whose frames stop is lost, though its connections stay open."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            now = loop.time()
            for peer, at in self._heard.items():
                if peer not in self._silent and now - at > SILENCE_S:
                    log.warning("fleet peer %s silent for %.1f s: lost", peer, now - at)
                    self._silent.add(peer)
                    self.lost(peer)

    def status(self) -> dict[str, object]:
        return {
            "self": self._self_id,
            "members": list(self._members),
            "up": sorted(p for p, o in self._outbound.items() if o.up and self.heard(p)),
            "received": self.received,
            "refused_frames": self.refused,
        }

    async def start(self, handler: PeerHandler) -> None:
        self.handler = handler
        server = grpc.aio.server(
            options=[
                ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
                ("grpc.keepalive_timeout_ms", int(KEEPALIVE_S * 1000)),
                ("grpc.http2.min_ping_interval_without_data_ms", int(KEEPALIVE_S * 500)),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        method = grpc.stream_unary_rpc_method_handler(
            self._link, request_deserializer=_identity, response_serializer=_identity
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("rmqproxy.fleet.Peers", {"Link": method}),)
        )
        try:
            self.port = server.add_insecure_port(self.listen)
            if self.advertise is None:
                self._self_id = f"{self.listen.rpartition(':')[0]}:{self.port}"
            await server.start()
        except BaseException:
            await server.stop(None)
            raise
        self._server = server
        await self._update(await self.source.resolve())
        self._refresh = start_background(self._follow(), name="fleet members", log=log)
        self._watchdog = start_background(self._watch_silence(), name="fleet silence", log=log)

    async def close(self) -> None:
        await stop_background(self._refresh)
        await stop_background(self._watchdog)
        for outbound in self._outbound.values():
            await stop_background(outbound.task)
        self._outbound.clear()
        if self._server is not None:
            await self._server.stop(None)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.source.refresh_s)
            await self._update(await self.source.resolve())

    async def _update(self, resolved: list[str] | None) -> None:
        """Follow the members: a link to each new one, none to one gone. None (the source
        could not say, e.g. DNS down) keeps the last list."""
        if resolved is None:
            return
        members = sorted(set(resolved) | {self._self_id})
        if members == self._members:
            return
        for peer in set(self._outbound) - set(members):
            await stop_background(self._outbound.pop(peer).task)
            self._heard.pop(peer, None)
            self._silent.discard(peer)
            self.lost(peer)  # what it subscribed to here ends now, not with its lease
        for peer in set(members) - set(self._outbound) - {self._self_id}:
            self._outbound[peer] = _Outbound(self, peer)
        log.info("fleet members: %s", members)
        self._members = members
        if self.handler is not None:
            self.handler.members_changed()

    async def _link(
        self, frames: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        peer = dict(context.invocation_metadata() or ()).get(MEMBER_HEADER)
        if not isinstance(peer, str) or peer == self._self_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{MEMBER_HEADER} missing")
        assert isinstance(peer, str)
        loop = asyncio.get_running_loop()
        async for frame in frames:
            self._heard[peer] = loop.time()
            if peer in self._silent:
                log.info("fleet peer %s heard again", peer)
                self._silent.discard(peer)
            try:
                messages = decode(frame)
            except ValueError as exc:
                self.refused += 1
                log.warning("fleet frame from %s refused: %s", peer, exc)
                continue
            self.received += len(messages)
            if self.handler is not None:
                for message in messages:
                    self.handler.receive(peer, message)
        return b""
