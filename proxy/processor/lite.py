"""Lite subscriptions (RocketMQ 5.5): a lite consumer's set of lite topics, kept on the
brokers, never on the proxy.

Each broker keeps, per client id, the lite topics of a parent topic the client wants
(LITE_SUBSCRIPTION_CTL) and queues an event for the client when one of them gets a message;
POP_LITE_MESSAGE takes those events. So a SyncLiteSubscription goes to every broker that
serves the parent topic, as the Apache proxy does: a broker keeps only the lite topics it
owns (the sharding of ``remoting/lite.py``) and those it already stores, and any proxy can
serve the client's next request.

A broker tells a client it lost a lite topic (an exclusive group gave it to another client,
the lite topic expired) with NOTIFY_UNSUBSCRIBE_LITE on the connection the client's last
subscription came on: this proxy's. The proxy passes it on to the client's Telemetry stream,
if the client has one open here (``register``); else it is dropped, as the Apache proxy
drops one for a client it does not know.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from proxy.brokers import BrokerPool
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import HeaderError, NotifyUnsubscribeLiteHeader
from proxy.remoting.lite import LiteAction, LiteSubscription

log = logging.getLogger(__name__)

# Told the lite topic a client lost; False when it could not take it (a full stream).
UnsubscribeSink = Callable[[str], bool]


class LiteSubscriptionFailure(RemotingError):
    """A broker refused a lite subscription or did not answer."""

    def __init__(self, broker: str, error: RemotingError) -> None:
        super().__init__(f"{broker}: {error}")
        self.broker = broker
        self.error = error


class LiteProcessor:
    def __init__(self, pool: BrokerPool, broker_timeout_s: float) -> None:
        self.pool = pool
        self.broker_timeout_s = broker_timeout_s
        # (group, client id) -> the open Telemetry streams of that lite consumer here.
        self._streams: dict[tuple[str, str], dict[int, UnsubscribeSink]] = {}
        self._ids = itertools.count()
        self.unsubscribes_delivered = 0
        self.unsubscribes_dropped = 0

    def start(self) -> None:
        self.pool.serve(RequestCode.NOTIFY_UNSUBSCRIBE_LITE, self.on_unsubscribe)

    def register(self, group: str, client_id: str, sink: UnsubscribeSink) -> Callable[[], None]:
        """A lite consumer's Telemetry stream; returns the call that forgets it."""
        key, stream = (group, client_id), next(self._ids)
        self._streams.setdefault(key, {})[stream] = sink

        def forget() -> None:
            sinks = self._streams.get(key)
            if sinks is not None:
                sinks.pop(stream, None)
                if not sinks:
                    del self._streams[key]

        return forget

    def on_unsubscribe(self, broker: str, cmd: RemotingCommand) -> RemotingCommand | None:
        """NOTIFY_UNSUBSCRIBE_LITE from ``broker``: tell the client's stream (no answer)."""
        try:
            header = NotifyUnsubscribeLiteHeader.decode(cmd.ext_fields)
        except HeaderError as exc:
            log.warning("bad NOTIFY_UNSUBSCRIBE_LITE from %s: %s", broker, exc)
            return None
        sinks = list(self._streams.get((header.consumer_group, header.client_id), {}).values())
        if any(sink(header.lite_topic) for sink in sinks[:1]):
            self.unsubscribes_delivered += 1
        else:
            self.unsubscribes_dropped += 1
            log.info(
                "lite unsubscribe of %s for %s/%s dropped: no stream here",
                header.lite_topic,
                header.consumer_group,
                header.client_id,
            )
        return None

    async def sync(self, subscription: LiteSubscription) -> None:
        """Apply ``subscription`` on every readable broker of its parent topic, all at once.
        Raises TopicNotFound or RemotingError (the route), or LiteSubscriptionFailure (the
        first broker that failed; the others are applied all the same, as in the Apache
        proxy: the client's next full sync puts every broker in step)."""
        route = await self.pool.route(subscription.topic)
        names = [b.name for b in route.readable]

        async def on(name: str) -> None:
            client = self.pool.broker(name)
            if client is None:
                raise LiteSubscriptionFailure(name, RemotingError("broker unknown"))
            try:
                await client.lite_subscription_ctl([subscription], timeout=self.broker_timeout_s)
            except RemotingError as exc:
                raise LiteSubscriptionFailure(name, exc) from None

        outcomes = await asyncio.gather(*(on(n) for n in names), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def drop_client(self, client_id: str, group: str, topic: str) -> None:
        """Drop everything ``client_id`` subscribed under ``topic`` (COMPLETE_REMOVE), when
        the client says it terminates; failures are logged: a broker also drops a
        subscription the client stops renewing (3 min on 5.5.0)."""
        try:
            await self.sync(LiteSubscription(LiteAction.COMPLETE_REMOVE, client_id, group, topic))
        except RemotingError as exc:
            log.info("dropping lite subscriptions of %s on %s: %s", client_id, topic, exc)
