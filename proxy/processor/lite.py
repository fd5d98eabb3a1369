"""Lite subscriptions (RocketMQ 5.5): a lite consumer's set of lite topics, kept on the
brokers, never on the proxy.

Each broker keeps, per client id, the lite topics of a parent topic the client wants
(LITE_SUBSCRIPTION_CTL) and queues an event for the client when one of them gets a message;
POP_LITE_MESSAGE takes those events. So a SyncLiteSubscription goes to every broker that
serves the parent topic, as the Apache proxy does: a broker keeps only the lite topics it
owns (the sharding of ``remoting/lite.py``) and those it already stores, and any proxy can
serve the client's next request.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.brokers import BrokerPool
from proxy.remoting.client import RemotingError
from proxy.remoting.lite import LiteAction, LiteSubscription

log = logging.getLogger(__name__)


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
