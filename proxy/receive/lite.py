"""A lite consumer's long poll (RocketMQ 5.5 lite topics): POP_LITE_MESSAGE on every broker.

A lite group's messages wait in per-lite-topic queues, and each broker queues an event for
the *client* (by client id) when a lite topic it subscribed gets a message; a lite pop takes
the client's events. NOTIFICATION knows nothing of this (it looks at the parent topic's
queues, which lite pops never move, so it says ``hasMsg`` for ever), so pop-with-notify has
no probe to park. What the broker offers instead is its own long polling of a lite pop,
parked under the client id and woken by an event for that client: the poll is served with
that, on every broker at once:

1. **Instant pops.** A lite pop without broker-side wait to every broker that serves the
   parent topic, together. Messages: they are the answer (at most the batch size; the rest
   are handed back).
2. **Parked pops.** Otherwise one lite pop per broker parked for the time left. The first
   that brings messages answers the poll; the others go on parked on their brokers until
   their time is up, and whatever one of them still brings is handed back at once.

A push consumer's poll (``named_broker_only``) watches only the broker it names, as the
Apache proxy serves every lite push poll: the client polls each broker itself. The
proxy keeps nothing: the brokers hold the subscriptions and events per client id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxy.brokers import BrokerPool
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.types import PolledMessage, ReceiveRequest, ReceiveResult
from proxy.remoting.broker_client import PopResult
from proxy.remoting.client import RemotingError

log = logging.getLogger(__name__)

# A parked pass shorter than this is not worth the requests: answer empty.
MIN_PARK_MS = 100


class LiteReceiver:
    def __init__(
        self, pool: BrokerPool, consumer: ConsumerProcessor, broker_timeout_s: float
    ) -> None:
        self.pool = pool
        self.consumer = consumer
        self.broker_timeout_s = broker_timeout_s

    async def receive(self, req: ReceiveRequest, client_id: str) -> ReceiveResult:
        """Serve one lite poll of ``client_id``. Raises TopicNotFound or RemotingError when
        the parent topic has no route."""
        route = await self.pool.route(req.topic)
        brokers = [b.name for b in route.readable]
        if req.named_broker_only and req.broker_hint in brokers:
            brokers = [req.broker_hint]
        loop = asyncio.get_running_loop()
        pops = len(brokers)
        found = await self._first(
            [self._pop(name, req, client_id, 0) for name in brokers],
            loop.time() + self.broker_timeout_s,
            wait_all=True,
        )
        if found:
            return ReceiveResult(self._fit(found, req), True, pops, 0)
        park_ms = int((req.answer_by - loop.time()) * 1000)
        if park_ms < MIN_PARK_MS or not brokers:
            return ReceiveResult([], False, pops, 0)
        pops += len(brokers)
        found = await self._first(
            [self._pop(name, req, client_id, park_ms) for name in brokers],
            req.answer_by,
            wait_all=False,
        )
        return ReceiveResult(self._fit(found, req), False, pops, 0)

    def _pop(
        self, broker: str, req: ReceiveRequest, client_id: str, poll_ms: int
    ) -> asyncio.Future[list[PolledMessage]]:
        """One lite pop as its own task; what it brings after the poll stopped waiting for
        it (``on_late``, or a callback added by ``_first``) is handed back."""

        async def call() -> list[PolledMessage]:
            client = self.pool.broker(broker)
            if client is None:
                return []
            try:
                result = await client.pop_lite(
                    client_id,
                    req.group,
                    req.topic,
                    max_nums=req.batch_size,
                    invisible_ms=req.invisible_ms,
                    poll_ms=poll_ms,
                    attempt_id=req.attempt_id,
                    timeout=poll_ms / 1000 + self.broker_timeout_s,
                    on_late=lambda late: self._hand_back_result(broker, req, late, "late"),
                )
            except RemotingError as exc:
                log.info("lite pop from %s failed: %s", broker, exc)
                return []
            return [PolledMessage(broker, req.group, m, lite=True) for m in result.messages]

        return asyncio.ensure_future(call())

    async def _first(
        self,
        calls: list[asyncio.Future[list[PolledMessage]]],
        deadline: float,
        *,
        wait_all: bool,
    ) -> list[PolledMessage]:
        """Messages of the calls: of all of them (``wait_all``), else of the first that
        brings any; by ``deadline``. Calls not waited for hand back what they bring."""
        loop = asyncio.get_running_loop()
        found: list[PolledMessage] = []
        pending = set(calls)
        try:
            while pending and (wait_all or not found):
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                for call in done:
                    found.extend(call.result())
        except asyncio.CancelledError:
            for call in pending:
                call.add_done_callback(self._hand_back_call("cancelled"))
            self._hand_back(found, "cancelled")
            raise
        for call in pending:
            call.add_done_callback(self._hand_back_call("deadline"))
        return found

    def _fit(self, found: list[PolledMessage], req: ReceiveRequest) -> list[PolledMessage]:
        """At most the batch size; the rest go back at once."""
        self._hand_back(found[req.batch_size :], "over_batch")
        return found[: req.batch_size]

    def _hand_back(self, messages: list[PolledMessage], reason: str) -> None:
        self.consumer.hand_back([m.popped for m in messages], reason)

    def _hand_back_call(self, reason: str) -> Callable[[asyncio.Future[list[PolledMessage]]], None]:
        def done(call: asyncio.Future[list[PolledMessage]]) -> None:
            if not call.cancelled() and call.exception() is None:
                self._hand_back(call.result(), reason)

        return done

    def _hand_back_result(
        self, broker: str, req: ReceiveRequest, result: PopResult, reason: str
    ) -> None:
        self._hand_back(
            [PolledMessage(broker, req.group, m, lite=True) for m in result.messages], reason
        )
